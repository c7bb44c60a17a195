"""A workload kind's plan as the requests sized, without running it (`[workload] scenario`;
docs/sizing.md): the scenario's requests in tokens, as its kind plans them (analysis/kinds:
`Planned.demand`), each prompt cut into blocks by what it shares (`recorded.BlockIds`).

Their arrivals depend on the answers: a session's next turn is sent its think time after the
turn before it ended, and a group waits for one of the kind's slots (a session of `max_active`, a
closed loop's connection). The end of a request is the simulation's to say, and the simulation
needs the arrivals: so the arrivals are settled by passes (`settle`). The first pass takes each
request to last what the engine's cost model says of it alone; each later one takes how long each
request lasted in the pass before, until no arrival moves by more than SETTLE_S."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from harness.analysis.kinds import Demand, Planned, figures_of
from harness.config import kinds, scenario
from harness.core.errors import InputError
from harness.inputs.traces import TraceRequest
from harness.sizing.recorded import BlockIds
from harness.sizing.stack import References, references

T = TypeVar("T")

# The arrivals are settled when a pass moves none of them by more than this (s)
SETTLE_S = 1e-3
# At most this many passes; a plan not settled by then is sized from its last, and says so
MAX_PASSES = 16


@dataclass(frozen=True)
class Dependent:
    """A kind's plan in tokens (analysis/kinds `Demand`): per request in plan order, its prompt
    and output tokens, when it may be sent (`ready_s`: after the start for the first of its
    group, else after the end of the request before it), whether it is its group's first; the
    groups' slots (None: no bound); the prompts' block references in plan order (`refs`,
    reordered at each pass as the requests arrive). `rate_scale`: the plan's times this many
    times faster."""

    refs: References
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    ready_s: np.ndarray
    first: np.ndarray
    slots: int | None
    block_tokens: int
    rate_scale: float = 1.0


@dataclass(frozen=True)
class ScenarioPlan:
    """A scenario's plan as read: the plan, the scenario's kind, and what its kind said of it."""

    kind: str
    plan: Dependent
    note: str


def demand_of(path: Path, slo_from: Path | None = None) -> tuple[str, Demand]:
    """The kind of the scenario at `path` and its plan in tokens (`Planned.demand`). InputError for
    a file that is not a scenario, a kind whose plan cannot be known without running it, and a plan
    with no times to speed up where the sizing file at `slo_from` asks an SLO capacity."""
    sc = scenario.load(path)
    kind = sc.workload.kind
    figures = figures_of(kind)
    if not isinstance(figures, Planned):
        can = ", ".join(n for n in kinds.names() if isinstance(figures_of(n), Planned))
        raise InputError(
            f"{path}: workload.kind: a {kind} workload's plan cannot be sized without running it (kinds that can: "
            f"{can}); run it and size its result folder ([workload] result = ...)"
        )
    d = figures.demand(sc)
    if not d.parts:
        raise InputError(f"{path}: its plan has no requests")
    if slo_from is not None and not any(d.ready_s):
        raise InputError(
            f"{slo_from}: slo.ttft_s: a {kind} plan has no times to speed up (its load is its concurrency), so no "
            "SLO capacity; expected no [slo] with it"
        )
    return kind, d


def read(path: Path, block_tokens: int, rate_scale: float, slo_from: Path | None = None) -> ScenarioPlan:
    """The plan of the scenario at `path` (`demand_of`), its prompts cut into blocks."""
    kind, d = demand_of(path, slo_from)
    ids = BlockIds(block_tokens)
    requests = [
        TraceRequest(i + 1, float(i), sum(n for _, n in parts), out, ids.of(parts))
        for i, (parts, out) in enumerate(zip(d.parts, d.output_tokens, strict=True))
    ]  # (their times: the plan's order, as `references` orders them)
    plan = Dependent(
        references(requests, block_tokens),
        np.array([r.input_length for r in requests], dtype=np.int64),
        np.array(d.output_tokens, dtype=np.int64),
        np.asarray(d.ready_s, dtype=np.float64),
        np.asarray(d.first, dtype=np.bool_),
        d.slots,
        block_tokens,
        rate_scale,
    )
    return ScenarioPlan(kind, plan, d.note)


def arrivals(d: Dependent, durations: np.ndarray, speed: float = 1.0) -> np.ndarray:
    """When each request arrives (plan order; s after the start) if each lasts `durations` from its
    arrival to its end, with the plan's times `speed` x rate_scale times faster: the first of a
    group when it is ready and the group has a slot (taken in the groups' order, held until its
    last request ends), a later one its `ready_s` after the one before it ended."""
    scale = speed * d.rate_scale
    out = np.empty(d.refs.requests)
    held: list[float] = []  # the ends of the groups holding a slot
    taken = 0.0  # when the group before took its slot
    end = 0.0
    for i in range(len(out)):
        if d.first[i]:
            if i and d.slots is not None:
                heapq.heappush(held, end)  # (the group before ended)
            if d.slots is not None and len(held) >= d.slots:
                taken = max(taken, heapq.heappop(held))
            out[i] = max(float(d.ready_s[i]) / scale, taken)
        else:
            out[i] = end + float(d.ready_s[i]) / scale
        end = out[i] + float(durations[i])
    return out


@dataclass(frozen=True)
class Ordered:
    """The plan's requests in arrival order (`order[k]`: the plan index of the k-th to arrive) at
    the arrivals given: their arrival times and prompts as a trace's references."""

    order: np.ndarray
    arrival_s: np.ndarray
    refs: References


@dataclass(frozen=True)
class Settled(Generic[T]):
    """The last pass: the requests in its arrival order, what the pass gave (`got`), how long each
    request lasted in it (plan order), how many passes were run, the largest move of an arrival
    in the last, and whether that was within SETTLE_S."""

    ordered: Ordered
    got: T
    lasted: np.ndarray
    passes: int
    change_s: float
    settled: bool


def ordered(d: Dependent, arrival: np.ndarray) -> Ordered:
    """The plan's requests at these arrivals (plan order), in arrival order (ties: plan order)."""
    order = np.argsort(arrival, kind="stable")
    return Ordered(order, arrival[order], d.refs.reordered(order))


def settle(d: Dependent, speed: float, first: np.ndarray, one: Callable[[Ordered], tuple[np.ndarray, T]]) -> Settled[T]:
    """The arrivals settled (the module's rule), the plan's times `speed` times faster: `first`,
    each request's duration for the first pass (plan order); `one(ordered)` simulates a pass,
    giving each request's duration from arrival to end (in arrival order) and what else the
    caller keeps of it."""
    arrival, passes = arrivals(d, first, speed), 0
    while True:
        passes += 1
        at = ordered(d, arrival)
        lasted, got = one(at)
        durations = np.empty(len(arrival))
        durations[at.order] = lasted
        again = arrivals(d, durations, speed)
        change = float(np.max(np.abs(again - arrival))) if len(arrival) else 0.0
        if change <= SETTLE_S or passes >= MAX_PASSES:
            return Settled(at, got, durations, passes, change, change <= SETTLE_S)
        arrival = again
