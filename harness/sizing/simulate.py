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
- Prefill of n prompt tokens of which c were loaded: a*(n - c) + b*(n^2 - c^2) seconds (the
  report's cost-model fit reads recompute the same way); decode: d seconds per output token.
"""

from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.errors import InputError


@dataclass(frozen=True)
class Cost:
    """The engine's timing: prefill a*n + b*n^2 seconds for n computed tokens from scratch, decode
    `decode_s` per output token."""

    prefill_a: float
    prefill_b: float
    decode_s: float

    def prefill_s(self, tokens: int, cached: int) -> float:
        return self.prefill_a * (tokens - cached) + self.prefill_b * (tokens * tokens - cached * cached)


@dataclass(frozen=True)
class Tier:
    """A tier as the timing sees it: its latency, and each instance's read bandwidth (bytes/s;
    None: free, as a GPU's own memory is against its compute)."""

    latency_s: float
    bandwidth: float | None


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


@dataclass(frozen=True)
class Result:
    """Per request: when its load began, how long its loads and its prefill took, its TTFT and
    end (seconds); per tier, every load as (instance, start, end, bytes), and the stretches in
    which the tier delivered bytes as (start, end, bytes/s): an instance that serves any load
    delivers its whole bandwidth, shared; a free tier's loads are instants, (t, t, bytes)."""

    start_s: np.ndarray
    load_s: np.ndarray
    prefill_s: np.ndarray
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    loads: list[np.ndarray]
    delivered: list[np.ndarray]

    def read_bandwidth(self, tier: int, bin_s: float) -> np.ndarray:
        """A tier's read bandwidth (bytes/s, all its instances together), exactly, averaged over
        bins of `bin_s` seconds from time 0 to its last byte."""
        stretches = self.delivered[tier]
        if not len(stretches):
            return np.zeros(0)
        out = np.zeros(int(stretches[:, 1].max() // bin_s) + 1)
        for a, b, rate in stretches:
            if b <= a:  # an instant: its bytes in its bin
                out[int(a // bin_s)] += rate
                continue
            for k in range(int(a // bin_s), int(b // bin_s) + 1):
                out[min(k, len(out) - 1)] += rate * max(0.0, min(b, (k + 1) * bin_s) - max(a, k * bin_s))
        return out / bin_s


ARRIVE, LOADED, TRANSFERRED, PREFILLED = 0, 1, 2, 3
EPS_S = 1e-9  # two event times closer than this are the same moment (float rounding)


def simulate(reqs: Requests, tiers: list[Tier], kv_bytes_per_token: float, cost: Cost) -> Result:
    """Every request's timing (the module's rules), by the compiled event loop."""
    return run(compiled_event_loop(), reqs, tiers, kv_bytes_per_token, cost)


def run(loop: Any, reqs: Requests, tiers: list[Tier], kv_bytes_per_token: float, cost: Cost) -> Result:
    """`simulate` with the event loop given (compiled, or `event_loop` itself as plain Python):
    the arrays it takes made here, its output split by tier."""
    n, k = len(reqs.arrival_s), len(tiers)
    worker = reqs.worker.astype(np.int64)
    instance = reqs.instance.astype(np.int64).reshape(n, k)
    # each tier's instances numbered across tiers; an instance's loads at once are at most one per
    # worker reading it (a worker loads one request at a time): that many heap slots each
    first = np.zeros(k + 1, dtype=np.int64)
    for t in range(k):
        first[t + 1] = first[t] + (int(instance[:, t].max()) + 1 if n else 0)
    slots = np.zeros(int(first[k]), dtype=np.int64)
    for t in range(k):
        pairs = np.unique(np.stack([instance[:, t], worker]), axis=1) if n else np.zeros((2, 0), dtype=np.int64)
        np.add.at(slots, first[t] + pairs[0], 1)
    slot_at = np.concatenate([[0], np.cumsum(slots)]).astype(np.int64)
    order = np.argsort(worker, kind="stable").astype(np.int64)  # each worker's requests in arrival order
    workers = int(worker.max()) + 1 if n else 0
    queue_at = np.concatenate([[0], np.cumsum(np.bincount(worker, minlength=workers))]).astype(np.int64)
    out = loop(
        reqs.arrival_s.astype(np.float64),
        worker,
        reqs.prompt_tokens.astype(np.int64),
        reqs.output_tokens.astype(np.int64),
        reqs.tier_tokens.astype(np.int64).reshape(n, k),
        instance,
        np.array([t.latency_s for t in tiers], dtype=np.float64),
        np.array([np.nan if t.bandwidth is None else t.bandwidth for t in tiers], dtype=np.float64),
        float(kv_bytes_per_token),
        float(cost.prefill_a),
        float(cost.prefill_b),
        float(cost.decode_s),
        first,
        slot_at,
        order,
        queue_at,
    )
    start, load, prefill, ttft, e2e, loads, delivered = out
    by_tier = [loads[loads[:, 0] == t][:, 1:] for t in range(k)]
    stretches = [delivered[delivered[:, 0] == t][:, 1:] for t in range(k)]
    return Result(start, load, prefill, ttft, e2e, by_tier, stretches)


@functools.cache
def compiled_event_loop() -> Any:
    """The event loop, compiled by numba at its first use in a process (and cached on disk)."""
    try:
        import numba
    except ImportError:
        raise InputError("sizing needs numba: pip install 'kvbench[sizing]'") from None
    return numba.njit(cache=True, nogil=True)(event_loop)


def event_loop(
    arrival: np.ndarray,
    worker: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    tier_tokens: np.ndarray,
    instance: np.ndarray,
    latency: np.ndarray,
    bandwidth: np.ndarray,
    kv: float,
    a: float,
    b: float,
    d: float,
    first: np.ndarray,
    slot_at: np.ndarray,
    order: np.ndarray,
    queue_at: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """The simulation's events in time order (ties: arrivals first, then as pushed). `first[k]`:
    tier k's first instance number; `slot_at[j]`: where instance j's heap of loads (target bytes
    attained, request) starts in the flat heap arrays; `order[queue_at[w]:queue_at[w + 1]]`:
    worker w's requests in arrival order. A shared instance gives each of its loads bandwidth / n:
    all advance alike in attained bytes (`served`), and a load ends when `served` reaches its
    target. Returns per request start, load, prefill, TTFT and end; the loads as rows (tier,
    instance, start, end, bytes) and the stretches each tier delivered as (tier, start, end,
    bytes/s). (Run compiled; the tests run it as Python too.)"""
    n, tiers = tier_tokens.shape
    start, load, pre, ttft = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    stage = np.zeros(n, dtype=np.int64)  # the tier a request loads from next
    began = np.zeros(n)  # when its current transfer began (after the tier's latency)
    loads = np.zeros((n * tiers, 5))
    delivered = np.zeros((n * tiers, 4))
    n_loads = n_delivered = 0
    m = len(slot_at) - 1  # shared instances
    served, at, since = np.zeros(m), np.zeros(m), np.zeros(m)
    active = np.zeros(m, dtype=np.int64)
    heap_target = np.zeros(slot_at[m])
    heap_req = np.zeros(slot_at[m], dtype=np.int64)
    head = queue_at[:-1].copy()  # each worker's next request to serve
    arrived = queue_at[:-1].copy()  # ... and the end of those arrived
    busy = np.zeros(len(queue_at) - 1, dtype=np.bool_)
    events = [(0.0, 0, 0, 0)]  # (time, order pushed, kind, request or instance)
    events.pop()
    seq = n
    nxt = 0  # the next arrival (requests come in arrival order)
    while nxt < n or events:
        if nxt < n and (not events or arrival[nxt] <= events[0][0]):
            now, kind, what = arrival[nxt], ARRIVE, nxt
            nxt += 1
        else:
            now, _, kind, what = heapq.heappop(events)
        start_load = -1  # a request whose next load (or its prefill) is to be set out
        again = -1  # an instance whose next end is to be set out, after that
        if kind == ARRIVE:
            w = worker[what]
            arrived[w] += 1
            if not busy[w]:
                i = order[head[w]]
                head[w] += 1
                busy[w] = True
                start[i] = now
                start_load = i
        elif kind == PREFILLED:
            i = what
            ttft[i] = now - arrival[i]
            w = worker[i]
            busy[w] = False
            if head[w] < arrived[w]:
                j = order[head[w]]
                head[w] += 1
                busy[w] = True
                start[j] = now
                start_load = j
        else:
            if kind == LOADED:
                i = what
                k = stage[i]
                nbytes = tier_tokens[i, k] * kv
                if np.isnan(bandwidth[k]):  # a free tier: its bytes at once
                    row = delivered[n_delivered]
                    row[0], row[1], row[2], row[3] = k, now, now, nbytes
                    n_delivered += 1
                    done = i
                else:
                    j = first[k] + instance[i, k]
                    if active[j]:  # advance: every load has attained as much more
                        served[j] += (now - at[j]) * bandwidth[k] / active[j]
                    else:
                        since[j] = now
                    at[j] = now
                    # push (served + bytes, i) onto instance j's heap
                    base, pos = slot_at[j], active[j]
                    target = served[j] + nbytes
                    while pos > 0:
                        parent = (pos - 1) // 2
                        pt, pi = heap_target[base + parent], heap_req[base + parent]
                        if pt < target or (pt == target and pi < i):
                            break
                        heap_target[base + pos], heap_req[base + pos] = pt, pi
                        pos = parent
                    heap_target[base + pos], heap_req[base + pos] = target, i
                    active[j] += 1
                    due = at[j] + max(0.0, heap_target[base] - served[j]) * active[j] / bandwidth[k]
                    seq += 1
                    heapq.heappush(events, (due if due != 0.0 else now, seq, TRANSFERRED, j))
                    done = -1
            else:  # TRANSFERRED: instance `what`'s first load may be done now
                j = what
                base = slot_at[j]
                done = -1
                if active[j]:
                    k = stage[heap_req[base]]
                    due = at[j] + max(0.0, heap_target[base] - served[j]) * active[j] / bandwidth[k]
                    if due <= now + EPS_S:
                        served[j] += (now - at[j]) * bandwidth[k] / active[j]
                        at[j] = now
                        target, i = heap_target[base], heap_req[base]
                        # pop: the last entry sifted down from the top
                        active[j] -= 1
                        last_t, last_i = heap_target[base + active[j]], heap_req[base + active[j]]
                        pos, size = 0, active[j]
                        while True:
                            child = 2 * pos + 1
                            if child >= size:
                                break
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
                        served[j] = max(served[j], target)
                        if not active[j]:
                            row = delivered[n_delivered]
                            row[0], row[1], row[2], row[3] = k, since[j], now, bandwidth[k]
                            n_delivered += 1
                        else:
                            again = j
                        done = i
            if done >= 0:  # a load ended: recorded, and the request goes on to its next
                k = stage[done]
                row = loads[n_loads]
                row[0], row[1], row[2], row[3], row[4] = (
                    k,
                    instance[done, k],
                    began[done],
                    now,
                    tier_tokens[done, k] * kv,
                )
                n_loads += 1
                stage[done] = k + 1
                start_load = done
        if start_load >= 0:  # its next load after its tier's latency, or its prefill
            i = start_load
            k = stage[i]
            while k < tiers and tier_tokens[i, k] == 0:
                k += 1
            stage[i] = k
            seq += 1
            if k == tiers:
                load[i] = now - start[i]
                c = 0
                for t in range(tiers):
                    c += tier_tokens[i, t]
                p = prompt[i]
                pre[i] = a * (p - c) + b * (p * p - c * c)
                heapq.heappush(events, (now + pre[i], seq, PREFILLED, i))
            else:
                began[i] = now + latency[k]
                heapq.heappush(events, (began[i], seq, LOADED, i))
        if again >= 0:
            j = again
            base = slot_at[j]
            k = stage[heap_req[base]]
            due = at[j] + max(0.0, heap_target[base] - served[j]) * active[j] / bandwidth[k]
            seq += 1
            heapq.heappush(events, (due if due != 0.0 else now, seq, TRANSFERRED, j))
    e2e = ttft + output * d
    return start, load, pre, ttft, e2e, loads[:n_loads], delivered[:n_delivered]
