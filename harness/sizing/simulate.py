"""A fleet's requests in virtual time (pure; docs/sizing.md, "Timing"): each request arrives when
the trace says, waits for its worker, loads its cached prefix from the tiers that hold it, then
prefills the rest; decoding overlaps the worker's next prefills. No wall clock: a heap of events,
in one loop over arrays (`event_loop`) that numba compiles (a fleet's 10^6 requests are 10^7
events: plain Python took 25 s for them, and the SLO capacity search runs the loop some 20 times).

- A worker serves one request's load and prefill at a time, in arrival order (as the emulator's
  GPU does).
- Loading from tier k takes its latency, then its bytes at the tier's bandwidth. A tier instance
  (one per worker, per node or for the cluster: its scope) divides its bandwidth equally among the
  loads it serves at each moment (processor sharing): the contention of many workers reading one
  shared tier. A request loads from its tiers one after the other, fastest first.
- A tier whose writes share its bandwidth (`Tier.shared_writes`) takes each request's new blocks
  (those it did not hold: `Requests.written`) once the request's prefill ends, as one more
  transfer beside its loads; nobody waits for it, but the loads beside it go slower. A tier that
  takes what the tier above evicts (`Tier.evicted_writes`) is given the blocks a request's room
  pushes out (`Requests.written` again) as soon as its worker takes it, and the request waits
  for that copy before its loads (as the Dynamo mocker copies the blocks it evicts into host
  memory): `Result.copy_s`. Other tiers' writes go behind, on a path of their own
  (`Result.writes` spreads them over the prefill that makes them).
- Prefill of n prompt tokens of which c were loaded: a*(n - c) + b*(n^2 - c^2) seconds (the
  report's cost-model fit reads recompute the same way); decode: d seconds per output token after
  the first, which the prefill gives (as the emulator and Dynamo's mocker time it, and as the
  median TPOT `[engine] fit_from` takes is measured).
"""

from __future__ import annotations

import functools
import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.sizing.stack import compiled


@dataclass(frozen=True)
class Cost:
    """The engine's timing: prefill a*n + b*n^2 seconds for n computed tokens from scratch, decode
    `decode_s` per output token after the first."""

    prefill_a: float
    prefill_b: float
    decode_s: float

    def prefill_s(self, tokens: int, cached: int) -> float:
        return self.prefill_a * (tokens - cached) + self.prefill_b * (tokens * tokens - cached * cached)

    def alone_s(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Each request's time from arrival to end with nothing cached and nothing before it."""
        p = prompt.astype(np.float64)
        return self.prefill_a * p + self.prefill_b * p * p + self.decode_s * np.maximum(output - 1, 0)


# How a tier takes the blocks written into it (a sizing file's `[[tiers]] writes`): "behind", on a
# path of its own that slows nothing; "shared", through its read bandwidth, beside its loads, once
# the request's prefill ends; "evicted", only those the tier above evicts, through its read
# bandwidth, before the request that evicts them goes on
WRITES = ("behind", "shared", "evicted")


@dataclass(frozen=True)
class Tier:
    """A tier as the timing sees it: its latency, each instance's read bandwidth (bytes/s; None:
    free, as a GPU's own memory is against its compute), and how the blocks written into it come
    (`writes`, one of WRITES)."""

    latency_s: float
    bandwidth: float | None
    writes: str = "behind"

    @property
    def shared_writes(self) -> bool:
        """Its writes go through its read bandwidth once their request's prefill ends."""
        return self.writes == "shared" and self.bandwidth is not None

    @property
    def evicted_writes(self) -> bool:
        """It takes what the tier above evicts, through its read bandwidth, and the request that
        evicts it waits for the copy."""
        return self.writes == "evicted" and self.bandwidth is not None


@dataclass(frozen=True)
class Requests:
    """What each request brings (arrays, one entry a request, in arrival order): when it arrives,
    its worker, its prompt and output tokens, the tokens each tier serves it (a row per request, a
    column per tier, fastest first), and which instance of each tier it reads (same shape)."""

    arrival_s: np.ndarray
    worker: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tier_tokens: np.ndarray
    instance: np.ndarray
    # the prompt tokens each request writes into each tier (same shape: the blocks the tier did not
    # hold, or for a tier that takes what the one above evicts, those the request's room evicts
    # from it); None: none written (a baseline with no tiers)
    written: np.ndarray | None = None

    def tail(self, k: int) -> Requests:
        """The last k requests (k >= 1): the same arrays' last k rows."""
        s, w = slice(-k, None), self.written
        return Requests(
            self.arrival_s[s],
            self.worker[s],
            self.prompt_tokens[s],
            self.output_tokens[s],
            self.tier_tokens[s],
            self.instance[s],
            None if w is None else w[s],
        )


@dataclass(frozen=True)
class Result:
    """Per request: when its worker took it, how long its loads and its prefill took, its TTFT and
    end (seconds); per tier, every load as (instance, start, end, bytes), the stretches in which
    the tier delivered bytes as (start, end, bytes/s): an instance that serves any transfer
    delivers its whole bandwidth, shared; a free tier's loads are instants, (t, t, bytes); and,
    where its writes share its bandwidth, every write as (instance, start, end, bytes); per
    request, how long it waited for the copies of what it evicted before its loads (`copy_s`:
    0 where it evicted nothing a tier takes)."""

    start_s: np.ndarray
    load_s: np.ndarray
    prefill_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    loads: list[np.ndarray]
    delivered: list[np.ndarray]
    # with a miss budget (`holds`): whether the share of requests it allows met the TTFT, decided
    # as soon as it was, either way (the times of the requests not done by then are 0)
    slo_held: bool | None = None
    wrote: list[np.ndarray] | None = None
    copy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def read_bandwidth(self, tier: int, bin_s: float) -> np.ndarray:
        """A tier's read bandwidth (bytes/s, all its instances together), averaged over bins of
        `bin_s` seconds from time 0 to its last byte: exactly, from what it delivered; where
        writes share it, each load's bytes spread evenly over the load (what it delivered counts
        the writes too)."""
        if self.wrote is not None and len(self.wrote[tier]):
            return binned(spread(self.loads[tier]), bin_s)
        return binned(self.delivered[tier], bin_s)

    def writes(self, written_bytes: np.ndarray) -> np.ndarray:
        """Stretches (start, end, bytes/s) of each request's writes of `written_bytes` (a tier's,
        per request) into a tier, spread over its prefill: the blocks it computes, written as
        they are made (an instant, (t, t, bytes), where the prefill took no time)."""
        some = written_bytes > 0
        a = (self.start_s + self.load_s)[some]
        took, size = self.prefill_s[some], written_bytes[some].astype(np.float64)
        rate = np.divide(size, took, out=size.copy(), where=took > 0)
        return np.column_stack((a, a + took, rate))


def spread(transfers: np.ndarray) -> np.ndarray:
    """Transfers (instance, start, end, bytes) as stretches (start, end, bytes/s), each at its
    average rate (an instant: (t, t, bytes))."""
    a, b, size = transfers[:, 1], transfers[:, 2], transfers[:, 3]
    took = b - a
    return np.column_stack((a, b, np.divide(size, took, out=size.copy(), where=took > 0)))


# The longest span of arrivals simulated (s): the clock is a float of seconds from the first, and
# up to here it still tells 0.2 microseconds apart.
CLOCK_SPAN_S = 1e9
# The most bins a bandwidth is averaged over (`bin_for`): a day of 0.1 s bins, 11.6 days of 1 s.
MAX_BINS = 1_000_000
# The most (stretch, bin) rows `binned` holds at once (some 40 bytes each): with MAX_BINS, what
# bounds its memory however long the stretches (a tier read at a few bytes a second).
BIN_ROWS = 4_194_304


def bin_for(last_s: float, bin_s: float) -> float:
    """The bin bandwidths are averaged over, from time 0 to `last_s`: `bin_s`, or where that would
    take more than MAX_BINS bins, the smallest whole multiple of it that takes at most as many."""
    return bin_s if last_s <= bin_s * MAX_BINS else bin_s * math.ceil(last_s / (bin_s * MAX_BINS))


def binned(stretches: np.ndarray, bin_s: float, rows: int = BIN_ROWS) -> np.ndarray:
    """Stretches (start, end, bytes/s; an instant: (t, t, bytes)) as bytes/s, exactly, averaged
    over bins of `bin_s` seconds from time 0 to the last byte (at most MAX_BINS + 1 of them:
    `bin_for`), `rows` (stretch, bin) rows at a time."""
    if not len(stretches):
        return np.zeros(0)
    a, b, rate = stretches[:, 0], stretches[:, 1], stretches[:, 2]
    assert b.max() // bin_s <= MAX_BINS + 1, "a bin narrower than bin_for's"
    # each stretch's share of each bin it spans, a run of stretches at once (a loop over the
    # stretches in Python took 8 % of a sizing): a row per (stretch, bin), BIN_ROWS at most
    first, last = (a // bin_s).astype(np.int64), (b // bin_s).astype(np.int64)
    spans = np.maximum(last - first, 0) + 1
    ends = np.cumsum(spans)
    out, lo = np.zeros(int(b.max() // bin_s) + 1), 0
    while lo < len(a):
        hi = max(lo + 1, int(np.searchsorted(ends, (ends[lo - 1] if lo else 0) + rows, side="right")))
        s = slice(lo, hi)
        out += _bin_rows(a[s], b[s], rate[s], first[s], spans[s], bin_s, len(out))
        lo = hi
    return out / bin_s


def _bin_rows(
    a: np.ndarray, b: np.ndarray, rate: np.ndarray, first: np.ndarray, spans: np.ndarray, bin_s: float, bins: int
) -> np.ndarray:
    """Bytes in each of `bins` bins from stretches (a, b, rate) spanning `spans` bins from `first`."""
    row = np.repeat(np.arange(len(a)), spans)
    k = first[row] + np.arange(len(row)) - np.repeat(np.cumsum(spans) - spans, spans)
    overlap = np.maximum(0.0, np.minimum(b[row], (k + 1) * bin_s) - np.maximum(a[row], k * bin_s))
    instant = b[row] <= a[row]  # its bytes in its bin
    return np.bincount(k, weights=np.where(instant, rate[row], rate[row] * overlap), minlength=bins)


ARRIVE, LOADED, TRANSFERRED, PREFILLED = 0, 1, 2, 3
# what the event loop gives: per request start, load, prefill, TTFT and end; the loads; the
# stretches delivered; the writes that shared a tier's bandwidth; whether a miss budget stopped it
# (_tally: MISSED, MET, or 0); per request, how long it waited for the copies of what it evicted
LoopOut = tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray
]
MISSED, MET = 1, 2
EPS_S = 1e-9  # two event times closer than this are the same moment (float rounding)


def simulate(reqs: Requests, tiers: list[Tier], kv_bytes_per_token: float, cost: Cost) -> Result:
    """Every request's timing (the module's rules), by the compiled event loop."""
    return run(compiled_event_loop(), reqs, tiers, kv_bytes_per_token, cost)


def holds(
    reqs: Requests, tiers: list[Tier], kv_bytes_per_token: float, cost: Cost, ttft_s: float, share: float
) -> bool:
    """Whether at least `share` of the requests meet a TTFT of `ttft_s` (the SLO capacity search's
    question, several times a search). The run keeps no loads, and stops as soon as its answer is
    certain: once more requests have missed the TTFT than `share` allows (such a load fails
    whatever the others do; a sweep's configurations spend most of their time in these runs,
    half of which fail), or once enough have met it (the rest cannot make it fail)."""
    n = len(reqs.arrival_s)
    if not n:
        return share <= 0.0  # (no request: a share of 0, as the SLO figures count it)
    allowed = miss_budget(n, share)
    return bool(run(compiled_event_loop(), reqs, tiers, kv_bytes_per_token, cost, False, (ttft_s, allowed)).slo_held)


def miss_budget(n: int, share: float) -> int:
    """The most of n requests that may miss while the share that meets it is still at least
    `share`, as the share is computed (the count that meets it over n, in floating point)."""
    m = min(n, max(0, int(n * (1.0 - share))))
    while m < n and (n - m - 1) / n >= share:
        m += 1
    while m > 0 and (n - m) / n < share:
        m -= 1
    return m


def run(
    loop: Any,
    reqs: Requests,
    tiers: list[Tier],
    kv_bytes_per_token: float,
    cost: Cost,
    loads: bool = True,
    budget: tuple[float, int] | None = None,
) -> Result:
    """`simulate` with the event loop given (compiled, or `event_loop` itself as plain Python),
    and the arrays it takes: `costs` (KV bytes per token, prefill a and b, decode per token);
    `first[k]`, tier k's first instance number, and `tier_of[j]` instance j's tier; `slot_at[j]`,
    where instance j's heap of transfers (target bytes attained, request; a write: n + request; a
    copy of evicted blocks: 2n + request) starts in the flat heap arrays; `order[queue_at[w]:
    queue_at[w + 1]]`, worker w's requests in arrival order; `(written, shares, waits)`, the
    tokens each request writes into each tier whose writes share its bandwidth after its prefill
    (`shares`) or before its loads (`waits`; no rows where none does). It gives per request
    start, copies, load, prefill, TTFT and end, and (if `loads`) the loads and shared writes as
    rows (tier, instance, start, end, bytes) and each tier's stretches delivered (tier, start,
    end, bytes/s), split by tier. `budget` (a TTFT, a count): the loop stops once more requests
    than the count miss it, or once so many meet it that the count cannot be passed (`slo_held`)."""
    n, k = len(reqs.arrival_s), len(tiers)
    worker = reqs.worker.astype(np.int64, copy=False)
    instance = reqs.instance.astype(np.int64, copy=False).reshape(n, k)
    # each tier's instances numbered across tiers; an instance's loads at once are at most one per
    # worker reading it (a worker loads one request at a time): that many heap slots each
    first = np.zeros(k + 1, dtype=np.int64)
    for t in range(k):
        first[t + 1] = first[t] + (int(instance[:, t].max()) + 1 if n else 0)
    workers = int(worker.max()) + 1 if n else 0
    slots = np.zeros(int(first[k]), dtype=np.int64)
    shares = np.array([t.shared_writes for t in tiers], dtype=np.bool_)
    waits = np.array([t.evicted_writes for t in tiers], dtype=np.bool_)
    written = np.zeros((0, k), dtype=np.int64)
    if reqs.written is not None and (shares | waits).any():
        written = np.where(shares | waits, reqs.written, 0).astype(np.int64)
    for t in range(k):
        # the workers reading each instance: a table of (instance, worker) pairs seen, where a
        # sort of the pairs (np.unique over columns) took half of a sizing's time
        seen = np.zeros((int(first[t + 1] - first[t]), workers), dtype=bool)
        seen[instance[:, t], worker] = True
        slots[first[t] : first[t + 1]] = seen.sum(axis=1)
        if len(written):  # and every write it may take at once, at most one a request
            slots[first[t] : first[t + 1]] += np.bincount(
                instance[written[:, t] > 0, t], minlength=first[t + 1] - first[t]
            )
    tier_of = np.repeat(np.arange(k, dtype=np.int64), np.diff(first))
    slot_at = np.concatenate([[0], np.cumsum(slots)]).astype(np.int64)
    # each worker's requests in arrival order (a stable sort of small integers: numpy's radix sort)
    narrow = worker.astype(np.int16) if workers <= np.iinfo(np.int16).max else worker
    order = np.argsort(narrow, kind="stable").astype(np.int64)
    queue_at = np.concatenate([[0], np.cumsum(np.bincount(worker, minlength=workers))]).astype(np.int64)
    out = loop(
        reqs.arrival_s.astype(np.float64, copy=False),
        worker,
        reqs.prompt_tokens.astype(np.int64, copy=False),
        reqs.output_tokens.astype(np.int64, copy=False),
        reqs.tier_tokens.astype(np.int64, copy=False).reshape(n, k),
        instance,
        np.array([t.latency_s for t in tiers], dtype=np.float64),
        np.array([np.nan if t.bandwidth is None else t.bandwidth for t in tiers], dtype=np.float64),
        np.array([kv_bytes_per_token, cost.prefill_a, cost.prefill_b, cost.decode_s], dtype=np.float64),
        first,
        tier_of,
        slot_at,
        order,
        queue_at,
        (written, shares, waits),
        loads,
        np.inf if budget is None else budget[0],
        n if budget is None else budget[1],
    )
    start, load, prefill, ttft, e2e, rows, delivered, writes, verdict, copy = out
    by_tier = [rows[rows[:, 0] == t][:, 1:] for t in range(k)]
    stretches = [delivered[delivered[:, 0] == t][:, 1:] for t in range(k)]
    writes[:, 4] *= kv_bytes_per_token  # (its rows hold tokens)
    wrote = [writes[writes[:, 0] == t][:, 1:] for t in range(k)] if len(written) else None
    held = None if budget is None else verdict != MISSED  # (run to its end: within the budget)
    # (the loop's load time runs from the worker's taking the request: its copies, then its loads)
    return Result(start, load - copy, prefill, ttft, e2e, by_tier, stretches, held, wrote, copy)


@functools.cache
def compiled_event_loop() -> Any:
    """The event loop, compiled at its first use in a process, with its helpers."""
    helpers = (
        _take,
        _begin,
        _next_step,
        _advance,
        _due,
        _heap_push,
        _heap_pop,
        _loaded,
        _delivered,
        _joined,
        _transferred,
        _write_new,
        _transfer_ends,
        _finished,
        _tally,
    )
    return compiled(event_loop, helpers)


SERVED, AT, SINCE = 0, 1, 2  # a shared instance's state: bytes each load attained, when, busy since


def event_loop(
    arrival: np.ndarray,
    worker: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    tier_tokens: np.ndarray,
    instance: np.ndarray,
    latency: np.ndarray,
    bandwidth: np.ndarray,
    costs: np.ndarray,
    first: np.ndarray,
    tier_of: np.ndarray,
    slot_at: np.ndarray,
    order: np.ndarray,
    queue_at: np.ndarray,
    writing: tuple[np.ndarray, np.ndarray],
    record: bool,
    slo_s: float,
    budget: int,
) -> LoopOut:  # pragma: no cover
    """The simulation's events in time order (ties: arrivals first, in order apart from the heap,
    then as pushed; `run` says what it takes and gives). A shared instance gives each of its n
    transfers bandwidth / n, all advancing alike in attained bytes to their targets; a free tier
    without latency gives its bytes at once, with no event. (Run compiled; tests run it as Python.)"""
    (kv, a, b, d), (n, tiers), written = (costs[0], costs[1], costs[2], costs[3]), tier_tokens.shape, writing[0]
    start, load, pre, ttft, began, copy = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    stage, pending, rows = np.zeros(n, np.int64), np.zeros(n, np.int64), n * tiers if record else 0  # next tier; copies
    loads, writes, counts = np.zeros((rows, 5)), np.zeros((rows if len(written) else 0, 5)), np.zeros(3, np.int64)
    delivered = np.zeros((rows + len(writes), 4))  # (a stretch ends as a transfer does)
    inst, active = np.zeros((len(slot_at) - 1, 3)), np.zeros(len(slot_at) - 1, dtype=np.int64)
    heap_target, heap_req = np.zeros(slot_at[-1]), np.zeros(slot_at[-1], dtype=np.int64)
    head, arrived, busy = queue_at[:-1].copy(), queue_at[:-1].copy(), np.zeros(len(queue_at) - 1, dtype=np.bool_)
    events, seq, nxt, verdict, tally = [(0.0, 0, 0, 0)][1:], n, 0, 0, np.zeros(2, np.int64)  # (t, pushed, kind, i)
    at = (first, tier_of, instance, bandwidth, inst, active, heap_target, heap_req, slot_at)  # (the instances)
    waiting = (writing, start, pending, copy)  # (the copies a request waits for before its loads)
    kept = (loads, delivered, writes, counts, stage, began, tier_tokens, kv, arrival, ttft, waiting)  # (and records)
    while nxt < n or events:
        if nxt < n and (not events or arrival[nxt] <= events[0][0]):
            now, kind, what = arrival[nxt], ARRIVE, nxt
            nxt += 1
        else:
            now, _, kind, what = heapq.heappop(events)
        go, again = -1, -1  # a request to set on its next step; then an instance's next end to set out
        if kind in (ARRIVE, PREFILLED):
            w = worker[what]
            arrived[w] += kind == ARRIVE
            if kind == PREFILLED:
                ttft[what], busy[w] = now - arrival[what], False
                verdict = _tally(tally, ttft[what], slo_s, budget, n)
                if verdict:
                    break
                if len(written):
                    seq, _ = _write_new(n + what, what, now, written[what] * kv, writing[1], at, events, seq)
            if not busy[w]:
                go = _take(w, now, order, head, arrived, busy, start)
                if go >= 0 and len(written):  # (only then: a call with the instances costs 30 % of the loop)
                    go, seq = _begin(go, now, pending, writing, kv, at, events, seq)
        elif kind == LOADED:
            k = stage[what]
            if np.isnan(bandwidth[k]):  # a free tier: its bytes at once
                go = _loaded(what, now, stage, instance, began, tier_tokens, kv, loads, counts, delivered, bandwidth)
            else:
                j, size = first[k] + instance[what, k], tier_tokens[what, k] * kv
                again = _joined(what, j, now, bandwidth[k], size, inst, active, heap_target, heap_req, slot_at)
        elif active[what]:  # TRANSFERRED: instance `what`'s first transfer may be done now
            go, again = _transfer_ends(what, n, now, at, kept)
        if go >= 0:
            t, step = _next_step(go, now, stage, tier_tokens, prompt, latency, start, load, pre, began, a, b)
            while step == LOADED and t == now and np.isnan(bandwidth[stage[go]]):
                # a free tier without latency (an event each cost 20 % of the loop)
                _loaded(go, now, stage, instance, began, tier_tokens, kv, loads, counts, delivered, bandwidth)
                t, step = _next_step(go, now, stage, tier_tokens, prompt, latency, start, load, pre, began, a, b)
            seq += 1
            heapq.heappush(events, (t, seq, step, go))
        if again >= 0:
            seq += 1
            due = _due(inst, active, heap_target, slot_at, again, bandwidth[tier_of[again]])
            heapq.heappush(events, (due if due != 0.0 else now, seq, TRANSFERRED, again))
    e2e = ttft + np.maximum(output - 1, 0) * d
    return start, load, pre, ttft, e2e, loads[: counts[0]], delivered[: counts[1]], writes[: counts[2]], verdict, copy


def _joined(
    i: int,
    j: int,
    now: float,
    bandwidth: float,
    size: float,
    inst: np.ndarray,
    active: np.ndarray,
    heap_target: np.ndarray,
    heap_req: np.ndarray,
    slot_at: np.ndarray,
) -> int:  # pragma: no cover
    """A transfer of `size` bytes joins instance j's now (request i's load, or where i is n plus a
    request, its write): j, whose next end to set out."""
    _advance(inst, active, j, now, bandwidth)
    _heap_push(heap_target, heap_req, slot_at[j], active[j], inst[j, SERVED] + size, i)
    active[j] += 1
    return j


def _transferred(
    j: int,
    k: int,
    now: float,
    bandwidth: float,
    inst: np.ndarray,
    active: np.ndarray,
    heap_target: np.ndarray,
    heap_req: np.ndarray,
    slot_at: np.ndarray,
) -> tuple[int, int]:  # pragma: no cover
    """Instance j (of tier k) done with its first load now: the request whose load it was, and j
    again if it has more loads in flight (their next end to set out), else -1."""
    _advance(inst, active, j, now, bandwidth)
    target, i = _heap_pop(heap_target, heap_req, slot_at[j], active[j])
    active[j] -= 1
    inst[j, SERVED] = max(inst[j, SERVED], target)
    return i, (j if active[j] else -1)


def _take(
    w: int, now: float, order: np.ndarray, head: np.ndarray, arrived: np.ndarray, busy: np.ndarray, start: np.ndarray
) -> int:  # pragma: no cover
    """Worker w takes its oldest waiting request (-1: none waits)."""
    if head[w] >= arrived[w]:
        return -1
    i = order[head[w]]
    head[w] += 1
    busy[w] = True
    start[i] = now
    return int(i)


def _next_step(
    i: int,
    now: float,
    stage: np.ndarray,
    tier_tokens: np.ndarray,
    prompt: np.ndarray,
    latency: np.ndarray,
    start: np.ndarray,
    load: np.ndarray,
    pre: np.ndarray,
    began: np.ndarray,
    a: float,
    b: float,
) -> tuple[float, int]:  # pragma: no cover
    """Request i's next load (after its tier's latency) or, none left, its prefill: when its
    event comes, and which."""
    tiers = tier_tokens.shape[1]
    k = stage[i]
    while k < tiers and tier_tokens[i, k] == 0:
        k += 1
    stage[i] = k
    if k < tiers:
        began[i] = now + latency[k]
        return began[i], LOADED
    load[i] = now - start[i]
    c = 0
    for t in range(tiers):
        c += tier_tokens[i, t]
    p = prompt[i]
    pre[i] = a * (p - c) + b * (p * p - c * c)
    return now + pre[i], PREFILLED


def _advance(inst: np.ndarray, active: np.ndarray, j: int, now: float, bandwidth: float) -> None:  # pragma: no cover
    """Instance j's loads brought up to `now`: each has attained its share of what it delivered."""
    if active[j]:
        inst[j, SERVED] += (now - inst[j, AT]) * bandwidth / active[j]
    else:
        inst[j, SINCE] = now
    inst[j, AT] = now


def _due(
    inst: np.ndarray, active: np.ndarray, heap_target: np.ndarray, slot_at: np.ndarray, j: int, bandwidth: float
) -> float:  # pragma: no cover
    """When instance j's first load ends, at the pace its loads go now."""
    return inst[j, AT] + max(0.0, heap_target[slot_at[j]] - inst[j, SERVED]) * active[j] / bandwidth


def _heap_push(
    heap_target: np.ndarray, heap_req: np.ndarray, base: int, size: int, target: float, req: int
) -> None:  # pragma: no cover
    """(target, req) onto the heap of `size` entries at `base` (ordered by target, then request)."""
    pos = size
    while pos > 0:
        parent = (pos - 1) // 2
        pt, pi = heap_target[base + parent], heap_req[base + parent]
        if pt < target or (pt == target and pi < req):
            break
        heap_target[base + pos], heap_req[base + pos] = pt, pi
        pos = parent
    heap_target[base + pos], heap_req[base + pos] = target, req


def _heap_pop(
    heap_target: np.ndarray, heap_req: np.ndarray, base: int, size: int
) -> tuple[float, int]:  # pragma: no cover
    """The first of the heap of `size` entries at `base`, taken off it (its last moved down from the
    top)."""
    top_t, top_i = heap_target[base], heap_req[base]
    size -= 1
    last_t, last_i = heap_target[base + size], heap_req[base + size]
    pos = 0
    while 2 * pos + 1 < size:
        child = 2 * pos + 1
        ct, ci = heap_target[base + child], heap_req[base + child]
        if child + 1 < size:
            rt, ri = heap_target[base + child + 1], heap_req[base + child + 1]
            if rt < ct or (rt == ct and ri < ci):
                child, ct, ci = child + 1, rt, ri
        if last_t < ct or (last_t == ct and last_i < ci):
            break
        heap_target[base + pos], heap_req[base + pos] = ct, ci
        pos = child
    if size:
        heap_target[base + pos], heap_req[base + pos] = last_t, last_i
    return top_t, int(top_i)


def _loaded(
    i: int,
    now: float,
    stage: np.ndarray,
    instance: np.ndarray,
    began: np.ndarray,
    tier_tokens: np.ndarray,
    kv: float,
    loads: np.ndarray,
    counts: np.ndarray,
    delivered: np.ndarray,
    bandwidth: np.ndarray,
) -> int:  # pragma: no cover
    """Request i's load from its current tier ended: recorded (a free tier's, whose bytes came at
    once, as an instant it delivered too), and the request on to its next."""
    k = stage[i]
    if len(loads):  # (recorded)
        row = loads[counts[0]]
        row[0], row[1], row[2], row[3], row[4] = k, instance[i, k], began[i], now, tier_tokens[i, k] * kv
        counts[0] += 1
    if np.isnan(bandwidth[k]):
        _delivered(delivered, counts, k, now, now, tier_tokens[i, k] * kv)
    stage[i] = k + 1
    return i


def _tally(tally: np.ndarray, ttft: float, slo_s: float, budget: int, n: int) -> int:  # pragma: no cover
    """One more of the n requests with its TTFT, against an SLO of `slo_s` (none: inf) of which
    at most `budget` may miss (`tally`: how many missed it, how many met it): MISSED once more
    have missed it, MET once so many have met it that the rest cannot pass the budget, else 0."""
    tally[0 if ttft > slo_s else 1] += 1
    if tally[0] > budget:
        return MISSED
    return MET if slo_s < np.inf and tally[1] >= n - budget else 0


def _write_new(
    tag: int, i: int, now: float, size: np.ndarray, which: np.ndarray, at: Any, events: Any, seq: int
) -> tuple[int, int]:  # pragma: no cover
    """Request i's writes (`size` bytes for each tier) join each tier `which` marks now, as
    transfers of their own (`tag`: n + i, after its prefill; 2n + i, before its loads), beside its
    loads: the count of events pushed, updated, and how many joined."""
    first, _, instance, bandwidth, inst, active, heap_target, heap_req, slot_at = at
    joined = 0
    for k in range(len(size)):
        if which[k] and size[k] > 0:
            joined += 1
            j = _joined(
                tag,
                first[k] + instance[i, k],
                now,
                bandwidth[k],
                size[k],
                inst,
                active,
                heap_target,
                heap_req,
                slot_at,
            )
            seq += 1
            heapq.heappush(events, (_due(inst, active, heap_target, slot_at, j, bandwidth[k]), seq, TRANSFERRED, j))
    return seq, joined


def _begin(
    i: int, now: float, pending: np.ndarray, writing: Any, kv: float, at: Any, events: Any, seq: int
) -> tuple[int, int]:  # pragma: no cover
    """Request i, just taken by its worker, set on its first load (i), or first waiting for the
    copies of what its blocks evict into the tiers that take them (`waits`: transfers 2n + i of
    n requests, which `_transfer_ends` sees done; -1); and the count of events pushed, updated."""
    written, _, waits = writing
    seq, pending[i] = _write_new(2 * len(written) + i, i, now, written[i] * kv, waits, at, events, seq)
    return (-1 if pending[i] else i), seq


def _transfer_ends(j: int, n: int, now: float, at: Any, kept: Any) -> tuple[int, int]:  # pragma: no cover
    """Instance j's first transfer, if it is done now: recorded, and the request to set on its next
    step (-1: none; a write after a prefill, which nobody waits for; a copy before a request's
    loads, but its last), and j again if it has more in flight (their next end to set out), else
    -1."""
    _, tier_of, instance, bandwidth, inst, active, heap_target, heap_req, slot_at = at
    loads, delivered, writes, counts, stage, began, tier_tokens, kv, arrival, ttft, waiting = kept
    (written, _, _), start, pending, copy = waiting
    k = tier_of[j]
    if _due(inst, active, heap_target, slot_at, j, bandwidth[k]) > now + EPS_S:
        return -1, -1
    i, again = _transferred(j, k, now, bandwidth[k], inst, active, heap_target, heap_req, slot_at)
    if again < 0:
        _delivered(delivered, counts, k, inst[j, SINCE], now, bandwidth[k])
    if i >= 2 * n:  # a copy its request waits for: on to its loads once all are done
        r = i - 2 * n
        _finished(writes, counts, k, instance[r, k], start[r], now, written[r, k])
        pending[r] -= 1
        if pending[r]:
            return -1, again
        copy[r] = now - start[r]
        return r, again
    if i >= n:
        _finished(writes, counts, k, instance[i - n, k], arrival[i - n] + ttft[i - n], now, written[i - n, k])
        return -1, again
    return _loaded(i, now, stage, instance, began, tier_tokens, kv, loads, counts, delivered, bandwidth), again


def _finished(
    writes: np.ndarray, counts: np.ndarray, k: int, j: int, since: float, until: float, tokens: float
) -> None:  # pragma: no cover
    """A write of `tokens` tokens' blocks into instance j of tier k, from the end of its request's
    prefill to now (its bytes filled in by `run`)."""
    if len(writes):  # (recorded)
        row = writes[counts[2]]
        row[0], row[1], row[2], row[3], row[4] = k, j, since, until, tokens
        counts[2] += 1


def _delivered(
    delivered: np.ndarray, counts: np.ndarray, k: int, since: float, until: float, rate: float
) -> None:  # pragma: no cover
    """A stretch in which tier k delivered `rate` bytes/s (an instant: `rate` is its bytes)."""
    if len(delivered):  # (recorded)
        row = delivered[counts[1]]
        row[0], row[1], row[2], row[3] = k, since, until, rate
        counts[1] += 1
