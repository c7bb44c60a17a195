"""A fleet sized from a trace (pure; docs/sizing.md): the trace's requests routed to workers,
each prompt block served by the fastest tier that holds it (tiers.py, from stack distances), the
requests replayed in virtual time through those tiers (simulate.py), and the figures a storage
architect asks for: the share of prompt tokens each tier serves, the read bandwidth each tier must
sustain (mean, p99 and max over time), TTFT against recomputing every prompt, the share of
requests within the TTFT SLO and the load the fleet carries within it (the SLO capacity, both
ways), the prefill GPU-seconds saved, and each tier's capacity curve (the
share served at fractions and multiples of its capacity, the others unchanged), with the capacity
past which doubling adds less than a point.

A kind's plan (`planned.Dependent`) has arrivals that depend on the answers: the fleet is sized
at its settled arrivals (planned.settle), with the tiers and recomputing every prompt each
settled on its own, and its SLO capacity found by settling the plan at each speed-up tried.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from harness.inputs.traces import TraceRequest
from harness.sizing import routing
from harness.sizing.planned import Dependent, Ordered, Settled, settle
from harness.sizing.simulate import Cost, Requests, Result, Tier, bin_for, binned, holds, simulate, spread
from harness.sizing.stack import References, TraceColumns, columns_references, knee
from harness.sizing.tiers import (
    Fleet,
    curve_tallies,
    scoped_distances,
    served_by,
    tokens_evicted,
    tokens_per_request,
    tokens_written,
)

# A tier's capacity curve: its share served at these multiples of its configured capacity.
CURVE_MULTIPLES = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 2.0, 4.0, 8.0, 16.0)
# The SLO capacity search: the highest arrival speed-up that holds on a grid from 2^-CAPACITY_STEPS
# to 2^CAPACITY_STEPS, each doubling halved until its steps are within CAPACITY_PRECISION (64
# steps a doubling): the speed-ups the search by doubling and bisecting tries, as it computes them.
CAPACITY_STEPS = 12
CAPACITY_PRECISION = 1.02
CAPACITY_GRID = 1 << math.ceil(math.log2(math.log(2) / math.log(CAPACITY_PRECISION)))
# A round-robin plan of this many requests or more guesses its capacity from a search over its
# last 1/GUESS_SHARE first (its routes and tiers do not change with the speed-up, so the tail is a
# slice): the search over all of them then starts there and asks 2-4 runs where it asked 8-9.
GUESS_MIN = 100_000
GUESS_SHARE = 8


@dataclass(frozen=True)
class Workload:
    """What sizing needs of a trace, requests in arrival order."""

    refs: References
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    block_tokens: int


def from_trace(requests: Sequence[TraceRequest], block_tokens: int, rate_scale: float, tenants: int = 1) -> Workload:
    """`from_columns` of the requests."""
    return from_columns(TraceColumns.of(requests), block_tokens, rate_scale, tenants)


def from_columns(c: TraceColumns, block_tokens: int, rate_scale: float, tenants: int = 1) -> Workload:
    """A trace's requests (arrivals from its first, `rate_scale` times faster), replayed by
    `tenants` independent tenants (scaled_up)."""
    ordered = scaled_up(c, tenants).in_time_order()
    t0 = ordered.timestamp_s[0] if ordered.requests else 0.0
    return Workload(
        columns_references(ordered, block_tokens),
        (ordered.timestamp_s - t0) / rate_scale,
        ordered.input_length,
        ordered.output_length,
        block_tokens,
    )


def scaled_up(c: TraceColumns, tenants: int) -> TraceColumns:
    """A trace made `tenants` times larger, for a fleet bigger than the one it was recorded on:
    each tenant replays every request with block ids of its own (tenants share no prefix: their
    users, documents and system prompts are their own), tenant k's arrivals starting k/tenants of
    the trace's span later, so that they overlap instead of arriving in step. The load is
    `tenants` times the trace's; each tenant's reuse is the trace's."""
    if tenants == 1 or not c.requests:
        return c
    ids = int(c.ids.max()) + 1 if len(c.ids) else 0
    span = float(c.timestamp_s.max() - c.timestamp_s.min())
    k = np.arange(tenants)
    return TraceColumns(
        (c.timestamp_s[None, :] + (k * span / tenants)[:, None]).ravel(),
        np.tile(c.input_length, tenants),
        np.tile(c.output_length, tenants),
        np.tile(c.id_count, tenants),
        (c.ids[None, :] + (k * ids)[:, None]).ravel(),
    )


@dataclass(frozen=True)
class TierPlan:
    """A tier as sizing sees it: its name, scope, capacity in blocks and timing."""

    name: str
    scope: str
    capacity_blocks: int
    timing: Tier


@dataclass(frozen=True)
class Plan:
    fleet: Fleet
    tiers: tuple[TierPlan, ...]
    kv_bytes_per_token: float
    cost: Cost
    slo_ttft_s: float | None
    slo_share: float  # a load holds the SLO when at least this share of its requests meet it
    bandwidth_bin_s: float
    routing: str = "round_robin"  # routing.ROUTINGS


def _routes(w: Workload, plan: Plan, cached: bool = True) -> np.ndarray:
    """Each request's worker, by the plan's routing. `prefix` matches the fastest per-worker
    tier (which the file must have); `kv_router` every block a worker holds in a tier of its own,
    each credited as Dynamo's router credits the tier holding it (routing.CACHE_HIT_CREDIT), as
    Dynamo's router hears of the blocks its workers offload to host memory too (its replay with
    a G2 reuses about as much as with a G1 that large: docs/sizing.md). Without a cache (`cached`
    False: the recompute baseline) they hold nothing, and route by load alone."""
    if plan.routing == "round_robin":
        return routing.round_robin(w.refs.requests, plan.fleet.workers)
    own = [t.capacity_blocks for t in plan.tiers if t.scope == "worker"]
    if plan.routing == "kv_router":
        credited = [(t.capacity_blocks, routing.CACHE_HIT_CREDIT[t.name]) for t in plan.tiers if t.scope == "worker"]
        return routing.kv_router(
            w.refs,
            w.arrival_s,
            w.prompt_tokens,
            w.output_tokens,
            w.block_tokens,
            plan.fleet.workers,
            credited if cached else [],
            plan.cost,
        )
    return routing.prefix(w.refs, w.arrival_s, w.prompt_tokens, plan.fleet.workers, own[0] if cached else 0, plan.cost)


def _placed(w: Workload, plan: Plan, cached: bool = True) -> tuple[Requests, list[np.ndarray]]:
    """The requests as the timing takes them: each one's worker, the instance of each tier it
    reads (a column per tier) and the tokens each tier serves it; and each tier's scoped
    distances (a reference's instance is its request's). Not `cached`: every prompt recomputed."""
    if not cached:
        nothing = np.zeros((w.refs.requests, 0), dtype=np.int64)
        return Requests(w.arrival_s, _routes(w, plan, cached), w.prompt_tokens, w.output_tokens, nothing, nothing), []
    p = placement(w, plan)
    return _requests(w, plan, p)[0], list(p.distances)


@dataclass(frozen=True)
class Placement:
    """Where a plan's requests go and what each tier's streams look like: each request's worker,
    the instance of each tier it reads (a column per tier), and each tier's scoped prefix
    distances (one per reference). What the tier capacities and bandwidths do not change: the
    configurations of a sweep that share `placement_key` share it, and it is most of a
    configuration's work on a large trace (sorting and the distance pass, per tier)."""

    worker: np.ndarray
    instance: np.ndarray
    distances: tuple[np.ndarray, ...]


def placement_key(plan: Plan) -> tuple[Any, ...]:
    """What a plan's Placement depends on: the fleet, the routing, the tiers' scopes, and the
    capacities the routing matches prompts against (none for round-robin: `_routes`)."""
    own = [t.capacity_blocks for t in plan.tiers if t.scope == "worker"]
    matched = None if plan.routing == "round_robin" or not own else own[0] if plan.routing == "prefix" else tuple(own)
    return plan.fleet, plan.routing, tuple(t.scope for t in plan.tiers), matched, plan.cost


def placement(w: Workload, plan: Plan) -> Placement:
    """The plan's routes and each tier's scoped distances (Placement)."""
    refs = w.refs
    worker = _routes(w, plan)
    instance = np.stack([plan.fleet.group(worker, t.scope) for t in plan.tiers], axis=1)
    # each reference's instance, at 16 bits where they fit (a reference's copy of its request's
    # instance is 1.5 GB at 64 bits for 10^7 requests)
    narrow = instance.astype(np.int16) if instance.size and instance.max() <= np.iinfo(np.int16).max else instance
    # tiers of one scope have the same streams: their distances computed once (a Dynamo-like
    # worker's device and host tiers are both per worker)
    first: dict[str, int] = {}  # each scope's first tier, in the tiers' order (a sweep of 10^7
    for k, t in enumerate(plan.tiers):  # requests peaked 1.4 GB higher with the cluster's first)
        first.setdefault(t.scope, k)
    by_scope = {scope: scoped_distances(refs, narrow[:, k][refs.request]) for scope, k in first.items()}
    return Placement(worker, instance, tuple(by_scope[t.scope] for t in plan.tiers))


def _requests(w: Workload, plan: Plan, p: Placement) -> tuple[Requests, np.ndarray]:
    """The requests with the tokens each tier serves them at the plan's capacities and those
    written into each (a tier that takes what the one above evicts: what each request's room
    evicts from it); and which tier serves each reference (served_by)."""
    capacities = [t.capacity_blocks for t in plan.tiers]
    tier = served_by(p.distances, capacities)
    tier_tokens = tokens_per_request(w.refs, tier, len(plan.tiers))
    written = np.stack(
        [
            tokens_evicted(w.refs, p.instance[:, k - 1], tier, capacities[k - 1], k, w.block_tokens)
            if k and t.timing.writes == "evicted"
            else tokens_written(w.refs, p.distances[k], capacities[k], w.block_tokens)
            for k, t in enumerate(plan.tiers)
        ],
        axis=1,
    )
    reqs = Requests(w.arrival_s, p.worker, w.prompt_tokens, w.output_tokens, tier_tokens, p.instance, written)
    return reqs, tier


@dataclass(frozen=True)
class Baseline:
    """Every prompt recomputed on the plan's fleet, routed as its router would route with nothing
    cached: each request's TTFT, the prefill GPU-seconds, and the SLO figures (None without an
    SLO). The tiers do not change it: the configurations of a sweep that share `baseline_key`
    share it."""

    ttft_s: np.ndarray
    prefill_gpu_s: float
    slo: dict[str, Any] | None


def baseline_key(plan: Plan) -> tuple[Any, ...]:
    """What a plan's Baseline depends on (its routes without a cache ignore the capacities)."""
    return plan.fleet, plan.routing, plan.cost, plan.slo_ttft_s, plan.slo_share


def baseline(w: Workload, plan: Plan) -> Baseline:
    """The plan's fleet recomputing every prompt (Baseline)."""
    none, _ = _placed(w, plan, cached=False)
    recompute = simulate(none, [], plan.kv_bytes_per_token, plan.cost)
    slo = None if plan.slo_ttft_s is None else _arm_slo(w, plan, none, [], recompute, cached=False)
    return Baseline(recompute.ttft_s, float(recompute.prefill_s.sum()), slo)


@dataclass(frozen=True)
class Sized:
    """A configuration sized: every figure (sizing.json's `figures`) and a row per request
    (`rows`: columns of equal length, requests in arrival order; `row_columns` names them)."""

    figures: dict[str, Any]
    rows: dict[str, np.ndarray]


def row_columns(tiers: Sequence[str]) -> list[str]:
    """A sized request's row (fleet.Sized.rows, the result folder's requests.csv.gz), for tiers
    named `tiers`: its index in arrival order, when it arrived (s from the first), its worker,
    prompt and output tokens, the tokens each tier served it and those computed, how long it
    queued for its worker, waited for the copies of what it evicted (`writes = "evicted"`; else
    0), loaded, prefilled, its TTFT and end-to-end time, and its TTFT when every prompt is
    recomputed. All simulated."""
    return [
        "request",
        "arrival_s",
        "worker",
        "prompt_tokens",
        "output_tokens",
        *(f"{t.lower()}_tokens" for t in tiers),
        "computed_tokens",
        "queue_s",
        "copy_s",
        "load_s",
        "prefill_s",
        "ttft_s",
        "e2e_s",
        "recompute_ttft_s",
    ]


def size(w: Workload | Dependent, plan: Plan, placed: Placement | None = None, base: Baseline | None = None) -> Sized:
    """Every figure of the fleet, and a row per request. `placed` and `base`: the plan's
    Placement and Baseline where a sweep computed them once for several configurations (they
    must be of this plan's `placement_key` and `baseline_key`; a kind's plan shares neither:
    its arrivals are each configuration's own)."""
    if isinstance(w, Dependent):
        return _size_dependent(w, plan)
    placed = placement(w, plan) if placed is None else placed
    base = baseline(w, plan) if base is None else base
    reqs, tier = _requests(w, plan, placed)
    timing = [t.timing for t in plan.tiers]
    cached = simulate(reqs, timing, plan.kv_bytes_per_token, plan.cost)
    slo = None if plan.slo_ttft_s is None else _slo(plan, _arm_slo(w, plan, reqs, timing, cached, True), base.slo)
    return _sized(w, plan, _Pass(w, reqs, cached, placed, tier), base, slo)


@dataclass(frozen=True)
class _Pass:
    """The requests through the simulation once: the workload (arrival order), as the timing took
    them, its result, and with the tiers their Placement and which tier served each reference."""

    w: Workload
    reqs: Requests
    result: Result
    placed: Placement | None = None
    tier: np.ndarray | None = None


def _sized(w: Workload, plan: Plan, cached: _Pass, base: Baseline, slo: dict[str, Any] | None) -> Sized:
    """The figures and rows of the requests through the tiers (`cached`) beside the Baseline."""
    assert cached.placed is not None and cached.tier is not None
    reqs, result, tier_tokens = cached.reqs, cached.result, cached.reqs.tier_tokens
    columns = [
        np.arange(w.refs.requests),
        w.arrival_s,
        reqs.worker,
        w.prompt_tokens,
        w.output_tokens,
        *(tier_tokens[:, k] for k in range(len(plan.tiers))),
        w.prompt_tokens - tier_tokens.sum(axis=1),
        result.start_s - w.arrival_s,
        result.copy_s,
        result.load_s,
        result.prefill_s,
        result.ttft_s,
        result.e2e_s,
        base.ttft_s,
    ]
    rows = dict(zip(row_columns([t.name for t in plan.tiers]), columns, strict=True))
    return Sized(_figures(w, plan, reqs, cached.tier, cached.placed.distances, result, base, slo), rows)


def _size_dependent(d: Dependent, plan: Plan) -> Sized:
    """A kind's plan sized at its settled arrivals: with the tiers, and recomputing every prompt
    (the Baseline, its TTFTs put in the order the requests arrived with the tiers), each settled
    on its own; sizing.json's `arrivals` says how each settled."""
    alone = plan.cost.alone_s(d.prompt_tokens, d.output_tokens)
    cached = settle(d, 1.0, alone, functools.partial(_one_pass, d, plan, True))
    recompute = settle(d, 1.0, alone, functools.partial(_one_pass, d, plan, False))
    ttft = np.empty(d.refs.requests)
    ttft[recompute.ordered.order] = recompute.got.result.ttft_s
    with_slo = plan.slo_ttft_s is not None
    base = Baseline(
        ttft[cached.ordered.order],
        float(recompute.got.result.prefill_s.sum()),
        _dependent_slo(d, plan, False, recompute) if with_slo else None,
    )
    slo = _slo(plan, _dependent_slo(d, plan, True, cached), base.slo) if with_slo else None
    sized = _sized(cached.got.w, plan, cached.got, base, slo)
    arrivals = {"cached": _settling(cached), "recompute": _settling(recompute)}
    return Sized({**sized.figures, "arrivals": arrivals}, sized.rows)


def _one_pass(d: Dependent, plan: Plan, cached: bool, at: Ordered) -> tuple[np.ndarray, _Pass]:
    """The plan's requests at these arrivals through the simulation, with the tiers or (not
    `cached`) recomputing every prompt: how long each lasted from arrival to end, and the pass."""
    w = Workload(at.refs, at.arrival_s, d.prompt_tokens[at.order], d.output_tokens[at.order], d.block_tokens)
    if not cached:
        reqs, _ = _placed(w, plan, cached=False)
        result = simulate(reqs, [], plan.kv_bytes_per_token, plan.cost)
        return result.e2e_s, _Pass(w, reqs, result)
    placed = placement(w, plan)
    reqs, tier = _requests(w, plan, placed)
    result = simulate(reqs, [t.timing for t in plan.tiers], plan.kv_bytes_per_token, plan.cost)
    return result.e2e_s, _Pass(w, reqs, result, placed, tier)


def _settling(s: Settled[_Pass]) -> dict[str, Any]:
    return {"settled": s.settled, "passes": s.passes, "last_change_s": s.change_s}


def _figures(
    w: Workload,
    plan: Plan,
    reqs: Requests,
    tier: np.ndarray,
    distances: Sequence[np.ndarray],
    cached: Result,
    base: Baseline,
    slo: dict[str, Any] | None,
) -> dict[str, Any]:
    """Every figure of the fleet (sizing.json's `figures`); `tier`: which tier serves each
    reference (served_by)."""
    refs = w.refs
    instance, tier_tokens, capacities = reqs.instance, reqs.tier_tokens, [t.capacity_blocks for t in plan.tiers]
    total = int(w.prompt_tokens.sum())
    served = tier_tokens.sum(axis=0)
    assert reqs.written is not None  # (`_requests` gives it)
    written = reqs.written
    bin_s = bin_for(_last_s(w, cached), plan.bandwidth_bin_s)
    return {
        "requests": int(refs.requests),
        "prompt_tokens": total,
        "span_s": float(w.arrival_s[-1] - w.arrival_s[0]) if refs.requests else 0.0,
        "bandwidth_bin_s": bin_s,
        "tiers": [
            {
                "name": t.name,
                "scope": t.scope,
                "instances": int(instance[:, k].max()) + 1 if refs.requests else 0,
                "capacity_blocks": t.capacity_blocks,
                "served_tokens": int(served[k]),
                "share": float(served[k] / total) if total else 0.0,
                "read_bytes_per_s": _reads(cached, k, bin_s),
                "written_tokens": int(written[:, k].sum()),
                "write_bytes_per_s": _writes(cached, k, written[:, k] * plan.kv_bytes_per_token, bin_s),
                "curve": _curve(refs, distances, tier, capacities, k),
            }
            for k, t in enumerate(plan.tiers)
        ],
        "computed_tokens": int(total - served.sum()),
        "ttft_s": _quantiles(cached.ttft_s),
        "recompute_ttft_s": _quantiles(base.ttft_s),
        "e2e_s": _quantiles(cached.e2e_s),
        "queue_s": _quantiles(cached.start_s - w.arrival_s),
        "copy_s": _quantiles(cached.copy_s),
        "prefill_gpu_s": float(cached.prefill_s.sum()),
        "recompute_prefill_gpu_s": base.prefill_gpu_s,
        "slo": slo,
    }


def _last_s(w: Workload, result: Result) -> float:
    """When the simulation's last byte moved: its last request's end, or a write shared with a
    tier's loads ending after it."""
    ends = [float((w.arrival_s + result.e2e_s).max())] if len(w.arrival_s) else [0.0]
    ends += [float(x[:, 2].max()) for x in result.wrote or [] if len(x)]
    return max(ends)


def _quantiles(x: np.ndarray) -> dict[str, float | None]:
    if not len(x):
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99), "max": float(x.max())}


def _reads(result: Result, k: int, bin_s: float) -> dict[str, float | None]:
    """Tier k's read bandwidth (all its instances, bytes/s): the mean over the time it was read
    at all (first load to last byte), and the p99 and max of its bins."""
    loads = result.loads[k]
    if not len(loads):
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    start, end, total = float(loads[:, 1].min()), float(loads[:, 2].max()), float(loads[:, 3].sum())
    return _bandwidth(result.read_bandwidth(k, bin_s), start, end, total, bin_s)


def _writes(result: Result, k: int, written_bytes: np.ndarray, bin_s: float) -> dict[str, float | None]:
    """Tier k's write bandwidth (all its instances, bytes/s), as `_reads` gives its reads': each
    request's blocks written as its prefill makes them (`Result.writes`), or where its writes
    share its bandwidth, as the simulation wrote them (each at its average rate)."""
    wrote = result.wrote[k] if result.wrote is not None else np.zeros((0, 4))
    stretches = spread(wrote) if len(wrote) else result.writes(written_bytes)
    if not len(stretches):
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}
    start, end = float(stretches[:, 0].min()), float(stretches[:, 1].max())
    return _bandwidth(binned(stretches, bin_s), start, end, float(written_bytes.sum()), bin_s)


def _bandwidth(bins: np.ndarray, start: float, end: float, total: float, bin_s: float) -> dict[str, float | None]:
    """The mean of `total` bytes over start to end (None where they are one instant), and the
    p50, p99 and max of the bins from start on."""
    bins = bins[int(start // bin_s) :]
    p50, p99 = np.percentile(bins, [50, 99]) if len(bins) else (0.0, 0.0)
    return {
        "mean": total / (end - start) if end > start else None,
        "p50": float(p50),
        "p99": float(p99),
        "max": float(bins.max()) if len(bins) else 0.0,
    }


def _curve(
    refs: References, distances: Sequence[np.ndarray], tier: np.ndarray, capacities: list[int], k: int
) -> dict[str, Any]:
    """Tier k at each of CURVE_MULTIPLES of its capacity (the other tiers unchanged): the share
    of prompt tokens it serves itself (`tier_share`), and the whole hierarchy's (`share`: a slower
    tier takes over what a smaller one no longer holds). The knee: the smallest of those
    capacities past which every doubling of tier k adds less than KNEE_GAIN to what it serves.

    One pass over the references for every multiple (`served_by` at each of them took 13 s a tier
    at 10^7 requests): a reference no faster tier serves (`tier`, served_by's answer at the
    configured capacities, is k or more) is served by tier k at capacity C when its distance
    there is below C, else by a slower tier if one holds it (the same rule)."""
    total = refs.prompt_tokens
    caps = [int(capacities[k] * m) for m in CURVE_MULTIPLES]  # ascending, as the multiples
    beyond = None  # whether a slower tier holds each reference
    for j in range(k + 1, len(capacities)):
        held = distances[j] < capacities[j]
        beyond = held if beyond is None else beyond | held
    faster, own, taken = curve_tallies(distances[k], tier, refs.serves, beyond, np.asarray(caps, np.float64), k)
    own, taken = np.cumsum(own), np.cumsum(taken)
    points = [
        {
            "multiple": m,
            "capacity_blocks": c,
            # tier k's, and what the slower tiers serve of the rest
            "share": float((faster + own[i] + taken[-1] - taken[i]) / total) if total else 0.0,
            "tier_share": float(own[i] / total) if total else 0.0,
        }
        for i, (m, c) in enumerate(zip(CURVE_MULTIPLES, caps, strict=True))
    ]
    return {"points": points, "knee_blocks": knee(caps, [p["tier_share"] for p in points])}


def _slo(plan: Plan, cached: dict[str, Any], recompute: dict[str, Any] | None) -> dict[str, Any]:
    """At the workload's rate: the share of requests within the TTFT SLO, with the tiers ("cached")
    and recomputing every prompt ("recompute": the Baseline's), each with its SLO capacity
    (_arm_slo), and the ratio of the two capacities (the paper's SLO capacity ratio, here
    simulated)."""
    assert recompute is not None  # (the Baseline of a plan with an SLO has its figures)
    out: dict[str, Any] = {"ttft_s": plan.slo_ttft_s, "share": plan.slo_share, "speedup_ceiling": 2**CAPACITY_STEPS}
    out["cached"], out["recompute"] = cached, recompute
    up, base = cached["capacity_speedup"], recompute["capacity_speedup"]
    out["capacity_ratio"] = None if up is None or not base else up / base
    return out


def _arm_slo(
    w: Workload, plan: Plan, reqs: Requests, timing: list[Tier], result: Result, cached: bool
) -> dict[str, Any]:
    """One way of serving (with the tiers, `cached`, or recomputing every prompt): the share of
    requests within the TTFT SLO at the workload's rate, and the SLO capacity: the highest
    arrival speed-up (x the workload's rate, after rate_scale) at which at least slo_share of the
    requests meet it. Round-robin routes and the tier each block comes from do not depend on time
    (LRU order is arrival order), so only the arrivals are scaled; prefix routes weigh each
    worker's queue, so the requests are placed again at each speed-up."""
    assert plan.slo_ttft_s is not None
    ttft_s = plan.slo_ttft_s

    def at(rows: Requests, x: float) -> bool:
        if plan.routing == "round_robin":
            fast = replace(rows, arrival_s=rows.arrival_s / x)
        else:  # (`rows` are all the requests: placed again)
            fast, _ = _placed(replace(w, arrival_s=w.arrival_s / x), plan, cached)
        return holds(fast, timing, plan.kv_bytes_per_token, plan.cost, ttft_s, plan.slo_share)

    n, guess = len(reqs.arrival_s), None
    if plan.routing == "round_robin" and n >= GUESS_MIN:
        guess = capacity_step(functools.partial(at, reqs.tail(n // GUESS_SHARE)))
    within = _within(result.ttft_s, ttft_s)
    cap, rate = slo_capacity(functools.partial(at, reqs), within >= plan.slo_share, guess), _rate(w.arrival_s)
    return {
        "within": within,
        "capacity_speedup": cap,
        "capacity_req_per_s": None if cap is None or rate is None else cap * rate,
    }


def _dependent_slo(d: Dependent, plan: Plan, cached: bool, now: Settled[_Pass]) -> dict[str, Any]:
    """`_arm_slo` of a kind's plan (`now`: settled at its own times): each speed-up tried settles
    the plan again with its times that many times faster (a session's start and think times, an
    open loop's sends), and the capacity in req/s is the arrival rate settled at the capacity,
    not the speed-up times the plan's (a session's turns wait for their answers)."""
    assert plan.slo_ttft_s is not None
    ttft_s = plan.slo_ttft_s
    rates: dict[float, float | None] = {}
    loose: list[float] = []

    def at(speedup: float) -> bool:
        # (first guess: the durations at the plan's own times; the one before's gave no fewer passes)
        s = settle(d, speedup, now.lasted, functools.partial(_one_pass, d, plan, cached))
        rates[speedup] = _rate(s.got.w.arrival_s)
        if not s.settled:
            loose.append(speedup)
        return _within(s.got.result.ttft_s, ttft_s) >= plan.slo_share

    within = _within(now.got.result.ttft_s, ttft_s)
    if now.settled:  # the search's first question, answered by the pass at the plan's own times
        rates[1.0] = _rate(now.got.w.arrival_s)
    cap = slo_capacity(at, within >= plan.slo_share if now.settled else None)
    return {
        "within": within,
        "capacity_speedup": cap,
        "capacity_req_per_s": None if cap is None else rates[cap],
        "unsettled_speedups": loose,  # tried, their arrivals not settled: answered from the last pass
    }


def _within(ttft: np.ndarray, slo_s: float) -> float:
    """The share of requests whose TTFT meets the SLO."""
    return float(np.mean(ttft <= slo_s)) if len(ttft) else 0.0


def _rate(arrival_s: np.ndarray) -> float | None:
    """The arrival rate (req/s) over the arrivals' span; None without a span."""
    span = float(arrival_s[-1] - arrival_s[0]) if len(arrival_s) > 1 else 0.0
    return (len(arrival_s) - 1) / span if span > 0 else None


def slo_capacity(holds: Callable[[float], bool], at_one: bool | None = None, guess: int | None = None) -> float | None:
    """The highest speed-up x on the search's grid (CAPACITY_GRID steps a doubling, each within
    CAPACITY_PRECISION) at which `holds(x)` (taken to hold below it and fail above it). None if
    it fails even 2^-CAPACITY_STEPS times as fast as the trace; 2^CAPACITY_STEPS if it holds even
    then. `at_one`: `holds(1.0)` where the caller knows it already (its simulation at the
    workload's own times is the one `holds` would run). `guess`: a grid step to start from
    (`capacity_step` of a part of the workload); it changes which runs are asked, not the answer."""
    m = capacity_step(holds, at_one, guess)
    return None if m is None else speedup(m)


def capacity_step(holds: Callable[[float], bool], at_one: bool | None = None, guess: int | None = None) -> int | None:
    """`slo_capacity` as the grid's step (0: 1x; CAPACITY_GRID: 2x). From the guess (or from 2x
    or 1/2x), steps of 1, 2, 4 ... (of CAPACITY_GRID, 2 CAPACITY_GRID ... without one) outwards
    until the answer is bracketed, then bisection: each speed-up asked once."""
    top = CAPACITY_STEPS * CAPACITY_GRID
    known: dict[int, bool] = {} if at_one is None else {0: at_one}

    def ok(m: int) -> bool:
        if m not in known:
            known[m] = holds(speedup(m))
        return known[m]

    lo, hi = (0, top + 1) if ok(0) else (-top - 1, 0)  # (the ends past the grid: never asked)
    step = 1 if guess is not None else CAPACITY_GRID
    m = min(max((lo + step if lo == 0 else hi - step) if guess is None else guess, lo + 1), hi - 1)
    if lo < m < hi and ok(m):
        lo = m
        while lo + step < hi and ok(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(hi, lo + step)
    elif lo < m < hi:
        hi = m
        while hi - step > lo and not ok(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(lo, hi - step)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return None if lo < -top else lo


def speedup(m: int) -> float:
    """The grid's step m as a speed-up, computed as a search doubling from 1x and bisecting by
    geometric means computes it: the same float whichever way the search came to it."""
    k, r = divmod(m, CAPACITY_GRID)
    lo, hi = 2.0**k, 2.0 ** (k + 1)
    a, b = 0, CAPACITY_GRID
    while r and (c := (a + b) // 2) != r:
        mid = (lo * hi) ** 0.5
        a, lo, b, hi = (c, mid, b, hi) if r > c else (a, lo, c, mid)
    return lo if not r else (lo * hi) ** 0.5
