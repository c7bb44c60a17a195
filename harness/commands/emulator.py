"""`kvbench emulator`: serve the emulated KV-tiered endpoint for other tools."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness import aio
from harness.clock import check_scale
from harness.errors import EndpointError, ExitCode, InputError
from harness.scenario import EmulatorCfg


@dataclass(frozen=True)
class EmulatorOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    profile: str = EmulatorCfg.profile
    time_scale: float = 1.0
    api_key_env: str | None = None
    timing_log: Path | None = None
    slowdown: float = 1.0
    embedded: bool = False


def main(o: EmulatorOptions) -> int:
    from harness.emulator.profiles import profiles
    from harness.emulator.serve import serve

    if o.profile not in profiles():
        raise InputError(f"--profile: expected one of {', '.join(sorted(profiles()))}, got {o.profile!r}")
    check_scale(o.time_scale, "--time-scale")
    check_scale(o.slowdown, "--slowdown")
    key = None
    if o.api_key_env is not None:
        key = os.environ.get(o.api_key_env)
        if not key:
            raise InputError(f"--api-key-env: environment variable {o.api_key_env} is not set or empty")
    try:
        aio.run(serve(o.host, o.port, o.profile, o.time_scale, key, o.timing_log, o.embedded, o.slowdown))
    except OSError as e:
        raise EndpointError(f"cannot listen on {o.host}:{o.port}: {e.strerror or e}") from None
    return ExitCode.OK
