"""Running the emulator: in the foreground (`kvbench emulator`), or as the child process that
`kvbench run` starts when no endpoint is given.

The embedded emulator runs in its own process, not in the client's: its CPU work (tokenizing and
hashing 130K-token prompts) would otherwise delay the client's timestamps. It lives exactly as
long as the client: it stops when its standard input closes, which happens when the client exits
for any reason, even a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from harness.core.errors import EndpointError
from harness.emulator.profiles import get_profile, with_capacities
from harness.emulator.server import Emulator

READY_PREFIX = "kvbench emulator listening on "


SHUTDOWN_S = 1.0


async def serve(
    host: str,
    port: int,
    profile: str,
    time_scale: float,
    api_key: str | None,
    timing_log: Path | None,
    embedded: bool,
    slowdown: float,
    capacity_blocks: dict[str, int] | None = None,
) -> None:
    model = with_capacities(get_profile(profile), capacity_blocks or {})
    emu = Emulator(model, time_scale, api_key=api_key, timing_log=timing_log, slowdown=slowdown)
    # On a stop, streams in flight get SHUTDOWN_S and no more (aiohttp's default waits 60 s for
    # them): the client has gone, or is going, and waits for this process to end.
    runner = web.AppRunner(emu.app(), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = runner.addresses[0][1]
    print(
        f"{READY_PREFIX}http://{host}:{bound}/v1 (profile {profile}, time scale {time_scale:g}, "
        + (f"slowed down {slowdown:g}x, " if slowdown != 1 else "")
        + f"model {emu.model}; emulated, not real hardware)",
        flush=True,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if embedded:
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

        async def watch_parent() -> None:
            await reader.read()  # EOF: the client is gone
            stop.set()

        watcher = asyncio.create_task(watch_parent())
    await stop.wait()
    if embedded:
        watcher.cancel()
    await runner.cleanup()


class EmbeddedEmulator:
    """The emulator as a child process on an ephemeral 127.0.0.1 port."""

    def __init__(
        self,
        profile: str,
        time_scale: float,
        timing_log: Path | None = None,
        api_key_env: str | None = None,
        slowdown: float = 1.0,
        capacity_blocks: dict[str, int] | None = None,
    ) -> None:
        self.slowdown = slowdown
        self.capacity_blocks = dict(capacity_blocks or {})
        self.profile = profile
        self.time_scale = time_scale
        self.timing_log = timing_log
        self.api_key_env = api_key_env
        self.base_url = ""
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> EmbeddedEmulator:
        cmd = [
            sys.executable,
            "-m",
            "harness",
            "emulator",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--profile",
            self.profile,
            "--time-scale",
            repr(self.time_scale),
            "--embedded",
        ]
        if self.timing_log:
            cmd += ["--timing-log", str(self.timing_log)]
        if self.api_key_env:
            cmd += ["--api-key-env", self.api_key_env]
        if self.slowdown != 1:
            cmd += ["--slowdown", repr(self.slowdown)]
        for tier, n in sorted(self.capacity_blocks.items()):
            cmd += ["--capacity-blocks", f"{tier}={n}"]
        # Its own session: a Ctrl-C meant for the client must not kill the server mid-request.
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # "" if the child died
        if not line.startswith(READY_PREFIX):
            self.__exit__(None, None, None)
            raise EndpointError(f"the embedded emulator did not start (it said: {line.strip()!r})")
        self.base_url = line[len(READY_PREFIX) :].split()[0]
        return self

    def __exit__(self, *_exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin:
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
