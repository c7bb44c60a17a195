"""Start llama.cpp's llama-server on an ephemeral loopback port with the tiny model, wait for
/health, and always stop it by PID: for tests, benches and anyone trying kvbench on a real engine.

    python engines/llamacpp/serve.py [--parallel 4]     # serves until Ctrl-C, prints the URL
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSION = "0.3.36"


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
    ) -> None:
        self.server, self.model = server, model
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
                self.ALIAS,
                "--no-webui",
            ]
            if self.slot_dir is not None:
                self.slot_dir.mkdir(parents=True, exist_ok=True)
                cmd += ["--slot-save-path", str(self.slot_dir)]
            if self.cache_ram_mib is not None:
                cmd += ["--cache-ram", str(self.cache_ram_mib)]
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
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


def main() -> None:
    import argparse

    sys.path.insert(0, str(HERE))
    from make_model import main as make_model

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--cache-ram", type=int, default=None, help="MiB of host-memory prompt cache (0: none)")
    ap.add_argument("--slot-dir", type=Path, default=None, help="where slots are saved (--slot-save-path)")
    args = ap.parse_args()
    server = binary()
    if server is None:
        raise SystemExit("llama-server is not built: run engines/llamacpp/build.sh")
    # SIGTERM unwinds like Ctrl-C: the server is stopped by PID and the model's folder removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny.gguf"
        make_model(model)
        with LlamaServer(
            server, model, parallel=args.parallel, slot_dir=args.slot_dir, cache_ram_mib=args.cache_ram
        ) as srv:
            print(srv.base_url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)


if __name__ == "__main__":
    main()
