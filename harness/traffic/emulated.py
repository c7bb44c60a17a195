"""Competing traffic for the embedded emulator: kvbench tells the emulator the load instead of
doing I/O, and the emulator's G4 model shares its storage bandwidth between KV loads and it."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from harness.config.traffic import TrafficCfg
from harness.core.clock import ModelClock
from harness.core.errors import EndpointError
from harness.server import endpoint
from harness.traffic.base import TrafficResult, settings_of

PATH = "/kvbench/traffic"


class EmulatedDriver:
    def __init__(self, cfg: TrafficCfg, base_url: str, clock: ModelClock) -> None:
        self.cfg = cfg
        self.url = endpoint.join(endpoint.root(base_url), PATH)
        self.clock = clock
        self.samples: list[tuple[float, float]] = []
        self.task: asyncio.Task[None] | None = None
        self.started_mono = 0.0

    async def _set(self, bps: float) -> float:
        try:
            async with aiohttp.ClientSession() as s, s.post(self.url, json={"bytes_per_s": bps}) as r:
                if r.status != 200:
                    raise EndpointError(
                        f'traffic.tool = "emulated" needs the kvbench emulator; '
                        f"{endpoint.redact(self.url)} answered HTTP {r.status}"
                    )
                return float((await r.json())["bytes_per_s"])
        except (aiohttp.ClientError, OSError) as e:
            raise EndpointError(f"{endpoint.redact(self.url)}: {e}") from None

    async def start(self) -> None:
        applied = await self._set(self.cfg.target_bytes_per_s or 0.0)
        self.started_mono = time.monotonic()

        async def sample() -> None:  # one point per model second
            while True:
                self.samples.append((time.monotonic(), applied))
                await asyncio.sleep(self.clock.wall_s(1.0))

        self.task = asyncio.create_task(sample())

    async def stop(self, clock: ModelClock) -> TrafficResult:
        if self.task is not None:
            self.task.cancel()
        await self._set(0.0)
        rows = [
            {"t_s": clock.at_mono(t), "client": "emulated", "read_bps": bps, "write_bps": 0.0}
            for t, bps in self.samples
        ]
        end = time.monotonic()
        total = clock.model_s(end - self.started_mono)
        res = TrafficResult(
            "emulated",
            settings_of(self.cfg),
            self.cfg.target_bytes_per_s,
            rows,
            {
                "emulated": {
                    "read_bytes": (self.cfg.target_bytes_per_s or 0) * total,
                    "write_bytes": 0.0,
                    "seconds": total,
                }
            },
            emulated=True,
            note="emulated: the emulator's storage model carried this load; no I/O was done",
        )
        return res
