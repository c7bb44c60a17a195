"""`kvbench emulator`: serve the emulated KV-tiered endpoint for other tools."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.config.scenario import EmulatorCfg
from harness.core import aio
from harness.core.clock import check_scale
from harness.core.errors import EndpointError, ExitCode, InputError


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
    capacity_blocks: tuple[str, ...] = ()  # "TIER=BLOCKS"


def parse_capacities(raw: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in raw:
        tier, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit() or int(n) < 1:
            raise InputError(f"--capacity-blocks: expected TIER=BLOCKS such as G1=1000, got {item!r}")
        out[tier.strip()] = int(n)
    return out


def main(o: EmulatorOptions) -> int:
    from harness.emulator.profiles import profiles, with_capacities
    from harness.emulator.serve import serve

    if o.profile not in profiles():
        raise InputError(f"--profile: expected one of {', '.join(sorted(profiles()))}, got {o.profile!r}")
    capacities = parse_capacities(o.capacity_blocks)
    try:
        with_capacities(profiles()[o.profile], capacities)
    except ValueError as e:
        raise InputError(f"--capacity-blocks: {e}") from None
    if not 0 <= o.port <= 65535:
        raise InputError(f"--port: expected a TCP port from 0 (any free one) to 65535, got {o.port}")
    check_scale(o.time_scale, "--time-scale")
    check_scale(o.slowdown, "--slowdown")
    key = None
    if o.api_key_env is not None:
        key = os.environ.get(o.api_key_env)
        if not key:
            raise InputError(f"--api-key-env: environment variable {o.api_key_env} is not set or empty")
    try:
        aio.run(serve(o.host, o.port, o.profile, o.time_scale, key, o.timing_log, o.embedded, o.slowdown, capacities))
    except OSError as e:
        raise EndpointError(f"cannot listen on {o.host}:{o.port}: {e.strerror or e}") from None
    return ExitCode.OK
