"""llama.cpp's llama-server, started and stopped by kvbench: on an ephemeral loopback port, with
a model made here (models.py) or a user's GGUF file, waited for until /health answers, and always
stopped by PID (its process group; and by the kernel if kvbench itself dies, on Linux). Used by
`[engine] kind = "llamacpp"` scenarios, the tests and benches, and engines/llamacpp/serve.py."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "0.3.36"  # the llama-cpp-python release whose llama.cpp engines/llamacpp/build.sh builds


def binary() -> Path | None:
    """llama-server from $KVBENCH_LLAMA_SERVER or build.sh's cache, if it is there."""
    env = os.environ.get("KVBENCH_LLAMA_SERVER")
    cache = Path(os.environ.get("KVBENCH_ENGINE_CACHE", "/var/cache/kvbench"))
    for p in (Path(env) if env else None, cache / f"llamacpp-{VERSION}" / "bin" / "llama-server"):
        if p is not None and p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: the kernel sends SIGTERM if kvbench dies without stopping it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LlamaServer:
    ALIAS = "kvbench-tiny-llama"

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
        self.server, self.model, self.alias = server, model, alias
        self.argv: list[str] = []
        self.parallel, self.ctx, self.threads = parallel, ctx_per_slot * parallel, threads
        self.slot_dir = slot_dir
        self.cache_ram_mib = cache_ram_mib  # the host-memory prompt cache (None: llama.cpp's default)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)  # noqa: SIM115

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LlamaServer:
        for _ in range(3):  # a free port can be taken between the check and the bind: try again
            self.port = free_port()
            cmd = [
                str(self.server),
                "-m",
                str(self.model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
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
            self.argv = cmd
            self.proc = subprocess.Popen(
                cmd,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
            if self._wait_healthy(60):
                return self
            self._stop()
        self.log.flush()
        tail = Path(self.log.name).read_text(errors="replace")[-1500:]
        self.__exit__(None, None, None)
        raise RuntimeError(f"llama-server did not become healthy: {tail}")

    def _wait_healthy(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r,
            ):
                if r.status == 200:
                    return True
            time.sleep(0.2)
        return False

    def __exit__(self, *_exc: object) -> None:
        self._stop()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)

    def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def version(server: Path) -> str:
    """What `llama-server --version` says (its build number and commit)."""
    try:
        got = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    lines = [x.strip() for x in (got.stdout + got.stderr).splitlines() if x.strip().startswith(("version", "built"))]
    return "; ".join(lines) or "unknown"


@dataclass
class Started:
    """An engine kvbench started for a run: its URL, its slot directory, what run.json says."""

    base_url: str
    slot_dir: Path
    info: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def start(cfg: Any, where: str) -> Iterator[Started]:
    """llama-server as the scenario's `[engine]` says (scenario.EngineCfg), stopped on the way out
    whatever happens; the models it makes and a slot directory it made are removed then."""
    from harness.engines import models
    from harness.errors import EndpointError, InputError

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
                slots,
                {
                    "kind": "llamacpp",
                    "started_by": "kvbench",
                    "version": version(server),
                    "model": {"alias": alias, **described},
                    "flags": flags,
                },
            )
        finally:
            srv.__exit__(None, None, None)
