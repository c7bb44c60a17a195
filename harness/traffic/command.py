"""Any other load generator (elbencho, gpfsperf, ...): started and stopped with the run, its
output kept in the run folder. kvbench cannot tell what bandwidth it achieved."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from harness.config.traffic import TrafficCfg
from harness.core.children import die_with_parent
from harness.core.clock import ModelClock
from harness.core.errors import EndpointError
from harness.traffic.base import TrafficResult, settings_of, stop_process


class CommandDriver:
    def __init__(self, cfg: TrafficCfg, folder: Path, run_name: str) -> None:
        self.cfg = cfg
        self.log = folder / "traffic-command.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_mono = 0.0

    async def start(self) -> None:
        assert self.cfg.command is not None
        try:
            with self.log.open("wb") as out:
                self.proc = subprocess.Popen(
                    list(self.cfg.command),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
        except OSError as e:
            raise EndpointError(f"traffic.command {self.cfg.command[0]!r}: {e.strerror or e}") from None
        self.started_mono = time.monotonic()
        await asyncio.sleep(0.2)

    async def stop(self, clock: ModelClock) -> TrafficResult:
        code = None
        if self.proc is not None:
            code = self.proc.poll()
            await asyncio.to_thread(stop_process, self.proc)
        res = TrafficResult(
            "command",
            settings_of(self.cfg),
            self.cfg.target_bytes_per_s,
            note="achieved bandwidth unknown: see traffic-command.log",
        )
        if code is not None:
            res.warnings.append(f"the traffic command exited early (code {code}), before the run ended")
        return res
