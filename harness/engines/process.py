"""A server process kvbench starts (an engine for a scenario, the tests, the benches): on an
ephemeral loopback port, waited for until /health answers, and always stopped by PID: its
process group, SIGTERM then SIGKILL, and, on Linux, by the kernel if kvbench itself dies."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Self

from harness.core.children import die_with_parent, stop_group


def installed(env_var: str, in_cache: str) -> Path | None:
    """An engine's executable: the one $`env_var` names, else `in_cache` below the engine cache
    ($KVBENCH_ENGINE_CACHE, default /var/cache/kvbench) where the build and install scripts put
    it; None when neither is there."""
    env = os.environ.get(env_var)
    cache = Path(os.environ.get("KVBENCH_ENGINE_CACHE", "/var/cache/kvbench"))
    for p in (Path(env) if env else None, cache / in_cache):
        if p is not None and p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def free_port(below: int | None = None) -> int:
    """A loopback port nobody listens on: the kernel's choice, or one under `below` (tried at
    random: the kernel's ephemeral range starts at 32768 on Linux)."""
    if below is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for port in random.sample(range(below // 2, below), 64):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    raise OSError(f"no free loopback port below {below}")


class ServerProcess:
    """Subclasses say how to start one (`command`); this class runs and stops it."""

    name = "server"
    health_timeout_s = 60.0
    port_below: int | None = None  # a server that cannot take a port of the ephemeral range
    health_path = "/health"  # answers 200 once the server is up

    def __init__(self, env: dict[str, str] | None = None, port: int = 0) -> None:
        """`port`: the one to listen on (a server started again where clients know it), else a
        free one of the kernel's choice."""
        self.env = env
        self.argv: list[str] = []
        self.port = self.wanted = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log", delete=False)  # noqa: SIM115

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> Self:
        # a free port can be taken between the check and the bind: try again (not a wanted one)
        for _ in range(1 if self.wanted else 3):
            self.port = self.wanted or free_port(self.port_below)
            self.argv = self.command(self.port)
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
            if self._wait_healthy(self.health_timeout_s):
                return self
            self._stop()
        self.log.flush()
        tail = Path(self.log.name).read_text(errors="replace")[-1500:]
        self.__exit__(None, None, None)
        raise RuntimeError(f"{self.name} did not become healthy: {tail}")

    def _wait_healthy(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.health_path}", timeout=2) as r,
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
        if proc is not None:
            stop_group(proc)
