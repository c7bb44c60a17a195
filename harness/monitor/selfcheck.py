"""Is the client itself the bottleneck? Event-loop lag and CPU use, sampled during every run.

Lag is measured as the time a callback waits in the loop's ready queue (scheduled with
call_soon from a timer, then stamped when it runs): the delay every arriving chunk also waits
before kvbench can stamp it. Timer granularity (about 1 ms) is not lag and is not counted."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.analysis.stats import EMULATOR_LATE_SHARE
from harness.core.clock import TIMER_GRANULARITY_S

LAG_P99_WARN_MS = 1.0
MIN_LAG_SAMPLES = 200  # a p99 of fewer samples is one outlier, not a tendency
CPU_WARN = 0.8
# A run's whole: the embedded emulator's first tokens may be late against its own schedule by
# stats.EMULATOR_LATE_SHARE of their modelled TTFT (median: a systematic lag) or by this share
# (p99: a tail of late requests) before its figures are called unreliable (each figure is also
# judged on its own: stats.emulator_late_share). Loop wake-up jitter alone stays below both (the
# TTFT sweep at 50: median 1.1 %, p99 3.5 %). Lateness under TIMER_GRANULARITY_S of wall-clock is
# the loop's, not an emulator that fell behind, whatever share of a short modelled TTFT it is
# (the smoke sweep at time scale 10: 4 requests, median 0.2 ms wall, 2 % once).
EMULATOR_LATE_SHARE_P99 = 0.5
# An open loop's schedule was not kept when its requests' p99 send lag passes the larger of
# these (model seconds; a share of the mean gap between intended sends), or when max_concurrency
# held any request back.
SCHEDULE_LAG_P99_WARN_S = 0.003
SCHEDULE_LAG_GAP_SHARE = 0.05


def emulator_warning(late: dict[str, Any] | None) -> str | None:
    """What to tell the user when the emulator ran behind its model (None when it kept up)."""
    if not late or not late.get("requests"):
        return None
    share = late.get("share_of_modelled_ttft") or {}
    p50, p99 = share.get("p50"), share.get("p99")
    if p50 is None or p99 is None:
        return None
    scale = late.get("time_scale") or 1.0
    wall = {q: (v or 0.0) / scale for q, v in (late.get("first_token_late_s") or {}).items()}
    behind_p50 = p50 > EMULATOR_LATE_SHARE and wall.get("p50", 1.0) >= TIMER_GRANULARITY_S
    behind_p99 = p99 > EMULATOR_LATE_SHARE_P99 and wall.get("p99", 1.0) >= TIMER_GRANULARITY_S
    if not behind_p50 and not behind_p99:
        return None
    return (
        f"the emulator could not keep its modelled time: its first tokens were late by {p50:.0%} (median) "
        f"and {p99:.0%} (p99) of their modelled TTFT, so these figures are not the model's; "
        f"run at a lower --time-scale (this run: {scale:g})"
    )


def schedule_warning(lag: dict[str, Any]) -> str | None:
    """What to tell the user when an open loop's load was not offered as scheduled."""
    p99, rate = lag.get("p99_s"), lag.get("intended_req_per_s")
    limit = max(SCHEDULE_LAG_P99_WARN_S, SCHEDULE_LAG_GAP_SHARE / rate if rate else 0.0)
    late = p99 is not None and p99 > limit
    held = lag.get("held_back") or 0
    if not late and not held:
        return None
    sent = lag.get("sent_req_per_s")
    what = []
    if late and p99 is not None:
        what.append(
            f"requests left late against their schedule (p99 {p99 * 1e3:.1f} ms, max {lag['max_s'] * 1e3:.1f} ms)"
        )
    if held:
        what.append(f"{held} were held back by max_concurrency")
    rates = f"; sent at {sent:.4g} req/s of {rate:.4g} intended" if sent and rate else ""
    return (
        "the offered load was not offered: " + " and ".join(what) + rates + ". The client or max_concurrency "
        "limited the load: spread it over processes (--workers N), raise max_concurrency, or offer less"
    )


# The client read kernel-stamped first tokens later than this (p99, wall-clock ms): busy
LATE_P99_WARN_MS = 1.0


def client_warning(health: dict[str, Any], reads: dict[str, Any]) -> str | None:
    """What to tell the user about the client's own load. Where the kernel stamped every first
    token, its lateness is measured directly (stats.first_token_reads) and the TTFTs do not move
    with it, save first tokens read together with later data of a server that paces its tokens;
    where any was stamped in user space, the loop-lag and CPU heuristics still speak for those."""
    if reads["user"] or not reads["kernel"]:
        return health.get("warning")
    p99 = reads["late_ms"]["p99"]
    if p99 is None or p99 <= LATE_P99_WARN_MS:
        return None
    shared = reads["shared_reads"]
    what = (
        f"; {shared} first tokens came in one read with later data of their response: where the server "
        "sends tokens apart rather than in one burst, their TTFT may be up to that lateness late"
        if shared
        else "; the kernel's stamps keep every TTFT right"
    )
    return (
        f"the client read responses late (p99 {p99:.2f} ms, max {reads['late_ms']['max']:.2f} ms after they "
        f"arrived){what}. Requests it sends wait as long: lower the concurrency or spread it (--workers N)"
    )


def _stamp(fut: asyncio.Future[float]) -> None:
    if not fut.done():
        fut.set_result(time.perf_counter())


@dataclass
class LoopMonitor:
    """Samples lag only while `active()` says requests are in flight: lag while kvbench builds
    the next prompt between requests distorts nothing."""

    active: Callable[[], bool] = field(default=lambda: True)
    interval_s: float = 0.01
    lags_ms: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # share of one core, per second
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last_wall, last_cpu = time.monotonic(), time.process_time()
        while True:
            await asyncio.sleep(self.interval_s)
            fut: asyncio.Future[float] = loop.create_future()
            queued = time.perf_counter()
            loop.call_soon(_stamp, fut)
            ran = await fut
            if self.active():
                self.lags_ms.append((ran - queued) * 1e3)
            now = time.monotonic()
            if now - last_wall >= 1.0:
                cpu_now = time.process_time()
                self.cpu.append((cpu_now - last_cpu) / (now - last_wall))
                last_wall, last_cpu = now, cpu_now

    def stop(self) -> dict[str, Any]:
        if self._task is not None:
            self._task.cancel()
        lags = sorted(self.lags_ms)

        def pct(p: float) -> float | None:
            return lags[min(len(lags) - 1, round((len(lags) - 1) * p))] if lags else None

        cpu_mean = sum(self.cpu) / len(self.cpu) if self.cpu else None
        summary: dict[str, Any] = {
            "loop_lag_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": lags[-1] if lags else None, "samples": len(lags)},
            "cpu_share_of_one_core": {"mean": cpu_mean, "max": max(self.cpu) if self.cpu else None},
            "cores": os.cpu_count(),
        }
        problems = []
        p99 = summary["loop_lag_ms"]["p99"]
        if p99 is not None and p99 > LAG_P99_WARN_MS and len(lags) >= MIN_LAG_SAMPLES:
            problems.append(f"event-loop lag p99 {p99:.2f} ms")
        if cpu_mean is not None and cpu_mean > CPU_WARN:
            problems.append(f"client CPU {cpu_mean:.0%} of a core")
        summary["warning"] = (
            (
                "the client was busy enough to distort TTFT (" + ", ".join(problems) + "): its timestamps may be late; "
                "lower the concurrency or run the client on a less loaded machine"
            )
            if problems
            else None
        )
        return summary
