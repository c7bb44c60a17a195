"""`kind = "open_loop"`: requests sent at the times of an arrival process (schedule.py), drawn
before the run, whether or not earlier ones have answered: the load an operator's users offer.
Each record keeps its intended send time (`intended_s`) beside the real one (`start_s`), so the
load that was really offered is known. `max_concurrency` holds requests back when that many are
in flight (`held_s` says for how long). Warm-up requests are sent first, at the rate, and
answered before the measured ones start: a cold first prefix or the queue it built must not be
measured.

The probes of `rates = "auto"` run here too: one request at a time ("serial") and a closed loop
of `auto_concurrency` connections ("saturated"), as closed_loop.py sends them.

With `--workers N` the processes take the schedule's next request in turn (distributed/) and
send it at its time on the shared clock; the measured part starts for all once every process has
its warm-up answered."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from harness.analysis import capacity
from harness.config.kinds import schedule
from harness.config.kinds.open_loop import OpenLoopConfig
from harness.config.scenario import Scenario
from harness.core import aio
from harness.core.errors import write_file
from harness.results import load_runs
from harness.wire.turns import Turns
from harness.workloads import closed_loop
from harness.workloads.base import Load, Plan, Schedule, Sender, Timed, build_pool
from harness.workloads.kind import ArmsDone, Driver, MeasureLoad

# Loop timers fire to the millisecond; the last SPIN_S before a send time is waited by yielding
# to the loop (which still serves every socket), so requests leave within tens of microseconds.
SPIN_S = 0.001
# Each request's task is started this long before its send time and waits for it itself, so that
# it sends in the loop turn its time comes in (a task started then would send a turn later).
LEAD_NS = 2_000_000
# What it takes kvbench to put a request on the wire (its body, aiohttp's request, a connection)
# is learnt from the last PACE_WINDOW requests, and each is dispatched that much early, so that
# it is written to the socket at the intended time; never more than PACE_MAX_NS early.
PACE_WINDOW = 32
PACE_MAX_NS = 5_000_000
# Requests of the "serial" probe (one at a time: its latency sets the lowest rate of the sweep).
SERIAL_PROBE_REQUESTS = 8
# Requests of the "saturated" probe per connection: enough for a steady state between the
# ramp-up and the drain (its throughput is the steady-state req/s of the statistics core).
PROBE_PER_CONNECTION = 4


class OpenLoop(Driver[OpenLoopConfig]):
    config = OpenLoopConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        sc = sender.spec.scenario
        w = self.cfg(sc)
        pool = prior.prompts if prior is not None else await build_pool(sender, w)
        load = load_of(sender)
        seed = w.seed_of(sc)
        times: tuple[float, ...] = ()
        if load.mode == "rate":
            assert load.rate is not None
            if load.requests is not None:  # an added load with its own count (RateSweep.narrow)
                w = replace(w, requests=load.requests, duration_s=None)
            times = tuple(float(t) for t in schedule.send_times(w, load.rate, seed))
            n, warmup = len(times), w.warmup_requests
        else:  # probes: a closed loop, counted from its first request
            n = SERIAL_PROBE_REQUESTS if load.mode == "serial" else PROBE_PER_CONNECTION * w.auto_concurrency
            n = load.requests or n  # the saturated probe again, longer (RateSweep.narrow)
            warmup = 0
        order = tuple(enumerate(w.schedule_picks(seed, load.label, n)))
        return Plan(n, pool, order, Timed(times, warmup) if load.mode == "rate" else None)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        load = load_of(sender)
        if load.mode != "rate":  # a probe: a closed loop on its own connections (ArmSpec.connections)
            await closed_loop.drive(sender, plan, take, connections, first)
            return
        spec = sender.spec
        # max_concurrency over all processes: each of several holds its share (`connections`)
        cap = self.cfg(spec.scenario).max_concurrency and (spec.connections if connections is None else connections)
        await send_timed(sender, plan, take, cap, connections, self.cfg(spec.scenario).warmup_shares_prefixes)

    async def run_arm(self, sc: Scenario, measure: MeasureLoad, console: Console, arm: str) -> None:
        w = self.cfg(sc)
        if not w.sweep_rates:
            await measure(Load("rate", w.rates[0]), None)
            return
        await RateSweep(w, measure, console, arm, sc.slo.share if sc.slo else None).run()

    def after_arms(self, done: ArmsDone) -> None:
        """The arms' curves and capacities: capacity.json beside the folders, and the tier's
        benefit in the terminal."""
        folders = [f for f in done.folders if (f / "run.json").exists()]
        if not folders:
            return
        doc = capacity.document(load_runs(folders, itl=False))
        path = done.results / f"{done.run_id}-capacity.json"
        name = done.scenario.name
        write_file(path, json.dumps({"run_id": done.run_id, "scenario_name": name, **doc}, indent=1) + "\n")
        for arm in doc["arms"]:
            c = arm["capacity_at_slo"]
            if c["bound"] != "no_slo":
                done.console.print(f"{arm['arm']}: {capacity.capacity_text(c)}", markup=False)
        for b in doc["benefit"]:
            text = capacity.sentence(b)
            done.console.print(text[0].upper() + text[1:], markup=False)
        done.console.print(f"Capacity summary: {path}", markup=False)


class RateSweep:
    """An open loop's arm at each of its rates, one result folder each, from the lowest up; with
    `rates = "auto"` first the two probes (one request at a time, then a saturated closed loop)
    whose throughputs bound the rates. It stops going up once the SLO fails at a rate or the
    server saturates."""

    def __init__(
        self, w: OpenLoopConfig, measure: MeasureLoad, console: Console, arm: str, share: float | None
    ) -> None:
        self.w, self.measure, self.console, self.arm, self.share = w, measure, console, arm, share
        self.folders: list[Path] = []
        self.loads = 0

    async def _one(self, load: Load) -> Any:
        self.loads += 1
        o = await self.measure(load, load.label)
        self.folders.append(o.folder)
        return o

    async def run(self) -> None:
        w = self.w
        rates = list(w.rates)
        if w.rates_auto:
            serial = await self._one(Load("serial", index=0))
            if serial.ends_run:
                return
            saturated = await self._one(Load("saturated", concurrency=w.auto_concurrency, index=1))
            if saturated.ends_run:
                return
            low = serial.summary.get("req_per_s")
            high = saturated.summary.get("steady_req_per_s") or saturated.summary.get("req_per_s")
            if not low or not high:
                self.console.print("[yellow]warning:[/] the probes measured no throughput: no rates to run")
                return
            rates = capacity.auto_rates(low, high, w.auto_points)
            listed = ", ".join(f"{r:.3g}" for r in rates)
            self.console.print(
                f"{self.arm}: one at a time {low:.3g} req/s, saturated {high:.3g} req/s: rates {listed}", markup=False
            )
        for rate in rates:
            o = await self._one(Load("rate", rate, index=self.loads))
            if o.ends_run:
                return
            why = capacity.stop_reason(o.summary, self.share)
            if why is not None and rate < rates[-1]:
                self.console.print(f"{self.arm}: stopped going up at {rate:.3g} req/s: {why}", markup=False)
                break
        if w.capacity_width is not None:
            await self.narrow(w.capacity_width, rates)

    async def narrow(self, width: float, rates: list[float]) -> None:
        """More loads where the capacity lies (capacity.narrowing) until its interval is at most
        `width` of it, or capacity_loads more have run; says which. Where a rate measured again
        now holds the SLO at every rate measured, the sweep's next rate up comes first."""
        added = 0
        while True:
            curve = self._curve()
            if curve is None or curve.capacity.bound == "no_slo":
                self.console.print(f"{self.arm}: capacity_width needs an [slo]: no loads added", markup=False)
                return
            top = max((p.offered_req_per_s for p in curve.points if p.mode == "rate"), default=0.0)
            higher = [r for r in rates if r > top]
            if curve.capacity.bound == "at_least" and higher and added < self.w.capacity_loads:
                self.console.print(
                    f"{self.arm}: every rate measured holds the SLO: going on up to {higher[0]:.3g} req/s", markup=False
                )
                added += 1
                if (await self._one(Load("rate", higher[0], index=self.loads))).ends_run:
                    return
                continue
            todo = capacity.narrowing(curve, width)
            now = capacity.width_of(curve.capacity)
            if todo is None:
                said = (
                    f"capacity interval {now:.0%} of the capacity, within capacity_width {width:.0%}"
                    if now is not None
                    else f"the capacity is a bound ({curve.capacity.bound}), which no interval narrows"
                )
                self.console.print(f"{self.arm}: {said} ({added} load(s) added)", markup=False)
                return
            # the saturated throughput's probe may have had too few or too irregular completions for one
            wide = f"{now:.0%} of the capacity, wider than" if now is not None else "not known yet, for"
            if added + len(todo) > self.w.capacity_loads:
                self.console.print(
                    f"{self.arm}: capacity interval still {wide} capacity_width "
                    f"{width:.0%}, after {added} load(s) added (capacity_loads {self.w.capacity_loads})",
                    markup=False,
                )
                return
            listed = ", ".join(
                f"{a.rate:.3g} req/s x {a.requests}" if a.rate is not None else f"the saturated probe x {a.requests}"
                for a in todo
            )
            self.console.print(
                f"{self.arm}: capacity interval {wide} capacity_width {width:.0%}: measuring {listed}",
                markup=False,
            )
            for a in todo:
                added += 1
                conc = self.w.auto_concurrency if a.mode == "saturated" else None
                load = Load(a.mode, a.rate, conc, index=self.loads, requests=a.requests)
                if (await self._one(load)).ends_run:
                    return

    def _curve(self) -> capacity.ArmCurve | None:
        runs = load_runs([f for f in self.folders if (f / "run.json").exists()], itl=False)
        curves = capacity.curves(runs)
        return curves[0] if curves else None


DRIVER = OpenLoop()


def load_of(sender: Sender) -> Load:
    load = sender.spec.load
    assert load is not None, "the runner gives every open-loop arm its load"
    return load


async def send_timed(
    sender: Sender,
    plan: Plan,
    take: Schedule | None,
    cap: int | None,
    connections: int | None = None,
    warmup_shares_prefixes: bool = False,
) -> None:
    """Each request of the plan at its time (plan.timed, after the warm-up is answered), with at
    most `cap` in flight. With `connections`, this is one of several processes sharing the
    schedule, with that share of the arm's connections (and so of its arrivals). The connections
    it is expected to need are opened once the warm-up is answered."""
    timed = TimedSends(sender, plan, cap, warmup_shares_prefixes)
    share = 1.0 if connections is None else connections / sender.spec.connections
    await timed.run(take if take is not None else Schedule(plan.schedule), share)


class TimedSends:
    """The requests of one process's part of a timed schedule, each sent in a task of its own
    that waits for its time: how early to dispatch each (learnt from the last sends), the
    warm-up's latencies, and the shift that starts the measured part once the warm-up is in."""

    def __init__(self, sender: Sender, plan: Plan, cap: int | None, warmup_shares_prefixes: bool) -> None:
        assert plan.timed is not None, "a timed schedule"
        self.sender, self.plan, self.timed, self.cap = sender, plan, plan.timed, cap
        self.warmup_shares_prefixes = warmup_shares_prefixes
        self.clock = sender.spec.clock
        self.slots = asyncio.Semaphore(cap) if cap else None
        self.tasks: set[asyncio.Task[None]] = set()
        self.setup: deque[int] = deque(maxlen=PACE_WINDOW)  # from its time to the request written, ns
        self.warmup_e2e: list[float] = []
        self.shift_ns = 0  # the measured schedule starts when the warm-up has been answered

    async def run(self, queue: Schedule, share: float) -> None:
        timed, sender = self.timed, self.sender
        with aio.collections_in_gaps() as collector:
            async for i, p in queue:
                if i >= timed.warmup and timed.warmup and not self.shift_ns:
                    await self.measured_part(queue, share)
                await self.dispatch(i, p, collector)
                if sender.stop.is_set():
                    break
            if self.tasks:
                await aio.together(*self.tasks)

    async def measured_part(self, queue: Schedule, share: float) -> None:
        """The warm-up answered (a cold first prefix, queues drained): the connections the measured
        part is expected to need opened, and its start agreed with the other processes."""
        timed, clock, cap = self.timed, self.clock, self.cap
        if self.tasks:
            await aio.together(*self.tasks)
        need = in_flight(timed, max(self.warmup_e2e, default=0.0), share)
        await self.sender.client.open_idle(self.sender.spec.url, min(need, cap or need))
        self.setup.clear()  # the warm-up's were slowed by new connections
        start = await queue.measured_start(time.perf_counter_ns())
        # the same for every process: the first measured request is sent at `start`
        self.shift_ns = max(1, start - clock.t0_ns - round(clock.wall_s(timed.times[timed.warmup]) * 1e9))

    async def dispatch(self, i: int, p: int, collector: aio.Collections) -> None:
        clock, setup = self.clock, self.setup
        early = min(PACE_MAX_NS, max(0, round(statistics.median(setup)))) if setup else 0
        due = clock.t0_ns + self.shift_ns + round(clock.wall_s(self.timed.times[i]) * 1e9) - early
        collector.in_gap(due - time.perf_counter_ns())
        if (wait := due - LEAD_NS - time.perf_counter_ns()) > 0:
            await asyncio.sleep(wait / 1e9)
        if not self.sender.stop.is_set():
            task = asyncio.create_task(self.one(i, p, self.shift_ns, due))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def one(self, i: int, p: int, shift: int, due: int) -> None:
        turns = self.sender.client.turns
        turns.expect(due)  # parsing yields to this send as it falls due, until it is written
        try:
            await until(due)
            if not self.sender.stop.is_set():
                await self.send(i, p, shift)
        finally:
            turns.written()

    async def send(self, i: int, p: int, shift: int) -> None:
        sender, spec, clock, plan, slots, timed = (
            self.sender,
            self.sender.spec,
            self.clock,
            self.plan,
            self.slots,
            self.timed,
        )
        dispatched = time.perf_counter_ns()
        held_ns = None if slots is None else await hold(slots, sender.client.turns)
        held = None if held_ns is None else clock.between(0, held_ns)
        try:
            prompt = plan.prompts[p]
            phase = "warmup" if i < timed.warmup else "run"
            intended = timed.times[i] + clock.between(0, shift)
            own = phase == "warmup" and not spec.bust and not self.warmup_shares_prefixes
            lead = spec.reuse_lead(prompt, "warmup/") if own else sender.lead_for(prompt)
            r = await sender.send(prompt, phase, lead, schedule_index=i, intended_s=intended, held_s=held)
            if phase == "warmup" and r.ok and r.e2e_s is not None:  # a failed one says nothing of latency
                self.warmup_e2e.append(r.e2e_s)
            if held is None:
                self.setup.append(round(clock.wall_s(r.start_s - clock.since_start(dispatched)) * 1e9))
            sender.check_bust(r)
        finally:
            if slots is not None:
                slots.release()


async def hold(slots: asyncio.Semaphore, turns: Turns) -> int | None:
    """Take a slot of max_concurrency; how long (ns) the request was held back for one, if it was."""
    if not slots.locked():
        await slots.acquire()
        return None
    turns.written()  # held back: parsing need not wait for it
    t = time.perf_counter_ns()
    await slots.acquire()
    return time.perf_counter_ns() - t


def in_flight(timed: Timed, latency_s: float, share: float) -> int:
    """Requests a process is expected to have in flight at most during the measured part: its
    `share` of the arrivals within one `latency_s` (the warm-up's longest), plus a margin of
    three standard deviations of a Poisson count."""
    times = timed.times[timed.warmup :]
    if len(times) < 2 or times[-1] <= times[0] or latency_s <= 0:
        return 0
    mean = share * (len(times) - 1) / (times[-1] - times[0]) * latency_s
    return math.ceil(mean + 3 * math.sqrt(mean))


async def until(due_ns: int) -> None:
    """Wait for a time.perf_counter_ns() deadline, to within tens of microseconds."""
    while (left := (due_ns - time.perf_counter_ns()) / 1e9) > 0:
        await asyncio.sleep(left - SPIN_S if left > SPIN_S else 0)
