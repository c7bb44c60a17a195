"""`kind = "open_loop"`: requests sent at the times of an arrival process (schedule.py), drawn
before the run, whether or not earlier ones have answered: the load an operator's users offer.
Each record keeps its intended send time (`intended_s`) beside the real one (`start_s`), so the
load that was really offered is known. `max_concurrency` holds requests back when that many are
in flight (`held_s` says for how long). Warm-up requests are sent first, at the rate, and
answered before the measured ones start: a cold first prefix or the queue it built must not be
measured.

The probes of `rates = "auto"` run here too: one request at a time ("serial") and a closed loop
of `auto_concurrency` connections ("saturated"), as closed_loop.py sends them.

With `--workers N` the processes take the schedule's next request in turn (workers.py) and
send it at its time on the shared clock; the measured part starts for all once every process has
its warm-up answered."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import deque

from harness import aio
from harness.wire.turns import TURNS
from harness.workloads import closed_loop, schedule
from harness.workloads.base import Load, Plan, Schedule, Sender, build_pool

NAME = "open_loop"
SHARES_SCHEDULE = True
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


def load_of(sender: Sender) -> Load:
    load = sender.spec.load
    assert load is not None, "the runner gives every open-loop arm its load"
    return load


async def plan(sender: Sender, prior: Plan | None = None) -> Plan:
    sc = sender.spec.scenario
    w = sc.workload
    pool = prior.prompts if prior is not None else await build_pool(sender)
    load = load_of(sender)
    seed = sc.prompts.seed if w.seed is None else w.seed
    times: tuple[float, ...] = ()
    if load.mode == "rate":
        assert load.rate is not None
        times = tuple(float(t) for t in schedule.send_times(w, load.rate, seed))
        n, warmup = len(times), w.warmup_requests
    else:  # probes: a closed loop, counted from its first request
        n = SERIAL_PROBE_REQUESTS if load.mode == "serial" else PROBE_PER_CONNECTION * w.auto_concurrency
        warmup = 0
    rng = random.Random(f"{seed}/schedule/{load.label}")
    order = tuple((i, rng.randrange(w.pool)) for i in range(n))
    return Plan(n, pool, order, times, warmup)


async def drive(
    sender: Sender,
    plan: Plan,
    take: Schedule | None = None,
    connections: int | None = None,
    first: int = 0,
) -> None:
    load = load_of(sender)
    if load.mode != "rate":  # a probe: a closed loop on its own connections (ArmSpec.connections)
        await closed_loop.drive(sender, plan, take, connections, first)
        return
    spec = sender.spec
    # max_concurrency over all processes: each of several holds its share (`connections`)
    cap = spec.scenario.workload.max_concurrency and (spec.connections if connections is None else connections)
    await send_timed(sender, plan, take, cap, connections)


async def send_timed(
    sender: Sender, plan: Plan, take: Schedule | None, cap: int | None, connections: int | None = None
) -> None:
    """Each request of the plan at its time (plan.times, after the warm-up is answered), with at
    most `cap` in flight. With `connections`, this is one of several processes sharing the
    schedule, with that share of the arm's connections (and so of its arrivals). The connections
    it is expected to need are opened once the warm-up is answered."""
    spec = sender.spec
    share = 1.0 if connections is None else connections / spec.connections
    clock = spec.clock
    slots = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()
    setup: deque[int] = deque(maxlen=PACE_WINDOW)  # from its time to the request written, ns
    warmup_e2e: list[float] = []

    async def one(i: int, p: int, shift: int, due: int) -> None:
        TURNS.expect(due)  # parsing yields to this send as it falls due, until it is written
        try:
            await until(due)
            if not sender.stop.is_set():
                await send(i, p, shift)
        finally:
            TURNS.written()

    async def send(i: int, p: int, shift: int) -> None:
        dispatched = time.perf_counter_ns()
        held_ns = None if slots is None else await hold(slots)
        held = None if held_ns is None else clock.between(0, held_ns)
        try:
            prompt = plan.prompts[p]
            phase = "warmup" if i < plan.warmup else "run"
            intended = plan.times[i] + clock.between(0, shift)
            own = phase == "warmup" and not spec.bust and not spec.scenario.workload.warmup_shares_prefixes
            lead = spec.reuse_lead(prompt, "warmup/") if own else sender.lead_for(prompt)
            r = await sender.send(prompt, phase, lead, schedule_index=i, intended_s=intended, held_s=held)
            if phase == "warmup" and r.ok and r.e2e_s is not None:  # a failed one says nothing of latency
                warmup_e2e.append(r.e2e_s)
            if held is None:
                setup.append(round(clock.wall_s(r.start_s - clock.since_start(dispatched)) * 1e9))
            sender.check_bust(r)
        finally:
            if slots is not None:
                slots.release()

    queue = take if take is not None else Schedule(plan.schedule)
    shift_ns = 0  # the measured schedule starts when the warm-up has been answered

    async def dispatch(i: int, p: int) -> None:
        early = min(PACE_MAX_NS, max(0, round(statistics.median(setup)))) if setup else 0
        due = clock.t0_ns + shift_ns + round(clock.wall_s(plan.times[i]) * 1e9) - early
        collector.in_gap(due - time.perf_counter_ns())
        if (wait := due - LEAD_NS - time.perf_counter_ns()) > 0:
            await asyncio.sleep(wait / 1e9)
        if not sender.stop.is_set():
            task = asyncio.create_task(one(i, p, shift_ns, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    with aio.collections_in_gaps() as collector:
        async for i, p in queue:
            if i >= plan.warmup and plan.warmup and not shift_ns:
                if tasks:  # every warm-up request answered (a cold first prefix, queues drained)
                    await asyncio.gather(*tasks)
                need = in_flight(plan, max(warmup_e2e, default=0.0), share)
                await sender.client.open_idle(spec.url, min(need, cap or need))
                setup.clear()  # the warm-up's were slowed by new connections
                start = await queue.measured_start(time.perf_counter_ns())
                # the same for every process: the first measured request is sent at `start`
                shift_ns = max(1, start - clock.t0_ns - round(clock.wall_s(plan.times[plan.warmup]) * 1e9))
            await dispatch(i, p)
            if sender.stop.is_set():
                break
        if tasks:
            await asyncio.gather(*tasks)


async def hold(slots: asyncio.Semaphore) -> int | None:
    """Take a slot of max_concurrency; how long (ns) the request was held back for one, if it was."""
    if not slots.locked():
        await slots.acquire()
        return None
    TURNS.written()  # held back: parsing need not wait for it
    t = time.perf_counter_ns()
    await slots.acquire()
    return time.perf_counter_ns() - t


def in_flight(plan: Plan, latency_s: float, share: float) -> int:
    """Requests a process is expected to have in flight at most during the measured part: its
    `share` of the arrivals within one `latency_s` (the warm-up's longest), plus a margin of
    three standard deviations of a Poisson count."""
    times = plan.times[plan.warmup :]
    if len(times) < 2 or times[-1] <= times[0] or latency_s <= 0:
        return 0
    mean = share * (len(times) - 1) / (times[-1] - times[0]) * latency_s
    return math.ceil(mean + 3 * math.sqrt(mean))


async def until(due_ns: int) -> None:
    """Wait for a time.perf_counter_ns() deadline, to within tens of microseconds."""
    while (left := (due_ns - time.perf_counter_ns()) / 1e9) > 0:
        await asyncio.sleep(left - SPIN_S if left > SPIN_S else 0)
