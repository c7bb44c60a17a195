"""llama.cpp's llama-server, started and stopped by kvbench (process.py): with a model made here
(models.py) or a user's GGUF file. Used by `[engine] kind = "llamacpp"` scenarios, the tests and
benches, and engines/llamacpp/serve.py."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.config.engines import LlamaEngineCfg
from harness.engines import Started
from harness.engines.process import ServerProcess, installed

VERSION = "0.3.36"  # the llama-cpp-python release whose llama.cpp engines/llamacpp/build.sh builds


def binary() -> Path | None:
    """llama-server from $KVBENCH_LLAMA_SERVER or build.sh's cache, if it is there."""
    return installed("KVBENCH_LLAMA_SERVER", f"llamacpp-{VERSION}/bin/llama-server")


class LlamaServer(ServerProcess):
    ALIAS = "kvbench-tiny-llama"
    name = "llama-server"

    def __init__(
        self,
        server: Path,
        model: Path,
        parallel: int = 4,
        ctx_per_slot: int = 8192,
        threads: int = 1,
        slot_dir: Path | None = None,
        cache_ram_mib: int | None = None,
        alias: str = ALIAS,
    ) -> None:
        super().__init__()
        self.server, self.model, self.alias = server, model, alias
        self.parallel, self.ctx, self.threads = parallel, ctx_per_slot * parallel, threads
        self.slot_dir = slot_dir
        self.cache_ram_mib = cache_ram_mib  # the host-memory prompt cache (None: llama.cpp's default)

    def command(self, port: int) -> list[str]:
        cmd = [
            str(self.server),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(self.ctx),
            "-np",
            str(self.parallel),
            "-t",
            str(self.threads),
            "--metrics",
            "--alias",
            self.alias,
            "--no-webui",
        ]
        if self.slot_dir is not None:
            self.slot_dir.mkdir(parents=True, exist_ok=True)
            cmd += ["--slot-save-path", str(self.slot_dir)]
        if self.cache_ram_mib is not None:
            cmd += ["--cache-ram", str(self.cache_ram_mib)]
        return cmd


def version(server: Path) -> str:
    """What `llama-server --version` says (its build number and commit)."""
    try:
        got = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    lines = [x.strip() for x in (got.stdout + got.stderr).splitlines() if x.strip().startswith(("version", "built"))]
    return "; ".join(lines) or "unknown"


@contextlib.contextmanager
def start(cfg: LlamaEngineCfg, where: str) -> Iterator[Started]:
    """llama-server as the scenario's `[engine]` says (config.engines.LlamaEngineCfg), stopped on the way out
    whatever happens; the models it makes and a slot directory it made are removed then."""
    from harness.core.errors import EndpointError, InputError
    from harness.engines import models

    server = binary()
    if server is None:
        raise EndpointError(
            f'{where}: [engine] kind = "llamacpp": llama-server is not built here: run engines/llamacpp/build.sh '
            "(or set KVBENCH_LLAMA_SERVER to a llama-server binary)"
        )
    with tempfile.TemporaryDirectory(prefix="kvbench-engine-") as tmp:
        if cfg.model in models.SIZES:
            model, size = models.make(Path(tmp) / f"{cfg.model}.gguf", cfg.model), models.SIZES[cfg.model]
            described: dict[str, Any] = {"made": cfg.model, "kv_bytes_per_token": size.kv_bytes_per_token}
        else:
            model = Path(cfg.model)
            if not model.is_file():
                raise InputError(f"{where}: engine.model: no GGUF file {cfg.model!r} (or give tiny or bench)")
            described = {"file": str(model)}
        slots = Path(cfg.slot_dir) if cfg.slot_dir is not None else Path(tmp) / "slots"
        alias = f"kvbench-{cfg.model}-llama" if cfg.model in models.SIZES else model.stem
        srv = LlamaServer(
            server,
            model,
            parallel=cfg.slots,
            ctx_per_slot=cfg.ctx_per_slot,
            threads=cfg.threads or os.cpu_count() or 1,
            slot_dir=slots,
            cache_ram_mib=cfg.cache_ram_mib,
            alias=alias,
        )
        try:
            srv.__enter__()
        except RuntimeError as e:
            raise EndpointError(f"{where}: [engine]: {e}") from None
        try:
            flags = [a if a != str(model) else model.name for a in srv.argv[1:]]
            yield Started(
                srv.base_url,
                slot_dir=slots,
                info={
                    "kind": "llamacpp",
                    "started_by": "kvbench",
                    "version": version(server),
                    "model": {"alias": alias, **described},
                    "flags": flags,
                },
            )
        finally:
            srv.__exit__(None, None, None)
