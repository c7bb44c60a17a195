"""Which worker serves each request of a fleet (pure; docs/sizing.md, "Routing").

- `round_robin`: request i (in time order) to worker i mod W.
- `prefix`: prefix-aware by time, in virtual time. Each request, in arrival order, goes to the
  worker where its prefill would end first: the work already queued there, then the prefill of
  what that worker's device cache does not hold of the request's prefix (the engine's cost
  model). Ties go to the worker free soonest, then the lowest index. Decoding is not counted as
  load: it overlaps the worker's next prefills, as the timing simulation models it. It finds
  every prefix the trace offers where the queues allow, more than Dynamo's router does.
- `kv_router`: Dynamo's KV router's cost (its router design page), in blocks: the blocks the
  request would prefill on a worker (its prompt less the prefix that worker's cache holds,
  weighted by `overlap_score_weight`, 1 by default as Dynamo's) plus the blocks active there (of
  every request routed to it and not yet finished, its prompt and output, the new request's
  included). The lowest cost wins, then the lowest index (Dynamo's temperature 0). A request is
  active from its arrival to its end as the engine's cost model places it on its worker (queued
  prefills, then its own, then its output tokens' decode).

For both, a worker's cache is simulated as the router sees it: an LRU (of the fastest per-worker
tier's capacity for `prefix`; of the largest for `kv_router`, whose router hears of host
offloads too: fleet._routes), every block the worker computes or loads written to it. A block's holders are
indexed, so a request is weighed only against the workers that hold its first block and the one
that would cost least without it; its cost is a walk of its blocks per candidate.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np

from harness.sizing.simulate import Cost
from harness.sizing.stack import References

ROUTINGS = ("round_robin", "prefix", "kv_router")
OVERLAP_SCORE_WEIGHT = 1.0  # Dynamo's default: a block to prefill weighs as much as an active one


def round_robin(requests: int, workers: int) -> np.ndarray:
    """Each request's worker: request i (in time order) goes to worker i mod workers (a
    reference's is its request's: `round_robin(...)[refs.request]`)."""
    return np.arange(requests, dtype=np.int64) % workers


class _Cache:
    """The router's view of one worker's device cache: an LRU of block ids."""

    __slots__ = ("blocks", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()


def prefix(
    refs: References, arrival_s: np.ndarray, prompt_tokens: np.ndarray, workers: int, capacity_blocks: int, cost: Cost
) -> np.ndarray:
    """Each request's worker by the KV router's rule (see the module's docstring)."""
    starts = np.searchsorted(refs.request, np.arange(refs.requests + 1))
    caches = [_Cache(capacity_blocks) for _ in range(workers)]
    holders: dict[int, set[int]] = {}
    free_at = np.zeros(workers)  # when each worker's queued prefills end
    out = np.empty(refs.requests, dtype=np.int64)
    blocks, serves = refs.blocks.tolist(), refs.serves.tolist()
    for i in range(refs.requests):
        lo, hi = int(starts[i]), int(starts[i + 1])
        mine, n, t = blocks[lo:hi], int(prompt_tokens[i]), float(arrival_s[i])
        cached = _held_prefix(mine, serves[lo:hi], holders, caches)
        soonest = int(np.argmin(free_at))
        cached.setdefault(soonest, 0)
        best = min(
            cached,
            key=lambda w: (max(float(free_at[w]), t) + cost.prefill_s(n, cached[w]), float(free_at[w]), w),
        )
        free_at[best] = max(float(free_at[best]), t) + cost.prefill_s(n, cached[best])
        _write(caches[best], best, mine, holders)
        out[i] = best
    return out


def kv_router(
    refs: References,
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    block_tokens: int,
    workers: int,
    capacity_blocks: int,
    cost: Cost,
    overlap_score_weight: float = OVERLAP_SCORE_WEIGHT,
) -> np.ndarray:
    """Each request's worker by Dynamo's KV router's cost (see the module's docstring)."""
    starts = np.searchsorted(refs.request, np.arange(refs.requests + 1))
    caches = [_Cache(capacity_blocks) for _ in range(workers)]
    holders: dict[int, set[int]] = {}
    free_at = np.zeros(workers)  # when each worker's queued prefills end
    active = np.zeros(workers)  # blocks of the requests routed to each and not yet finished
    ends: list[tuple[float, int, int]] = []  # (when, worker, blocks) of each active request
    out = np.empty(refs.requests, dtype=np.int64)
    blocks, serves = refs.blocks.tolist(), refs.serves.tolist()
    for i in range(refs.requests):
        lo, hi = int(starts[i]), int(starts[i + 1])
        mine, n, t = blocks[lo:hi], int(prompt_tokens[i]), float(arrival_s[i])
        while ends and ends[0][0] <= t:
            _, w, b = heapq.heappop(ends)
            active[w] -= b
        cached = _held_prefix(mine, serves[lo:hi], holders, caches)
        cached.setdefault(int(np.argmin(active)), 0)  # the one that costs least holding nothing
        new = math.ceil((n + int(output_tokens[i])) / block_tokens)
        logits = {w: overlap_score_weight * (n - h) / block_tokens + float(active[w]) + new for w, h in cached.items()}
        best = min(logits, key=lambda w: (logits[w], w))
        free_at[best] = max(float(free_at[best]), t) + cost.prefill_s(n, cached[best])
        heapq.heappush(ends, (float(free_at[best]) + int(output_tokens[i]) * cost.decode_s, best, new))
        active[best] += new
        _write(caches[best], best, mine, holders)
        out[i] = best
    return out


def _held_prefix(
    blocks: list[int], serves: list[int], holders: dict[int, set[int]], caches: list[_Cache]
) -> dict[int, int]:
    """Per worker holding the request's first block: the tokens of its longest prefix that
    worker's cache holds (the blocks that can serve: the prompt's last one cannot)."""
    if not blocks or not holders.get(blocks[0]):
        return {}
    out: dict[int, int] = {}
    for w in holders[blocks[0]]:
        held, cache = 0, caches[w].blocks
        for b, s in zip(blocks, serves, strict=True):
            if b not in cache:
                break
            held += s
        out[w] = held
    return out


def _write(cache: _Cache, worker: int, blocks: list[int], holders: dict[int, set[int]]) -> None:
    """The request's blocks into the worker's cache (most recent last), evicting the least
    recently used past its capacity."""
    lru = cache.blocks
    for b in blocks:
        if b in lru:
            lru.move_to_end(b)
            continue
        lru[b] = None
        holders.setdefault(b, set()).add(worker)
        if len(lru) > cache.capacity:
            old, _ = lru.popitem(last=False)
            holders[old].discard(worker)
