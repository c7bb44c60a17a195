"""Which worker serves each request of a fleet (pure; docs/sizing.md, "Routing").

- `round_robin`: request i (in time order) to worker i mod W.
- `prefix`: prefix-aware by time, in virtual time. Each request, in arrival order, goes to the
  worker where its prefill would end first: the work already queued there, then the prefill of
  what that worker's device cache does not hold of the request's prefix (the engine's cost
  model). Ties go to the worker free soonest, then the lowest index. Decoding is not counted as
  load: it overlaps the worker's next prefills, as the timing simulation models it. It finds
  every prefix the trace offers where the queues allow, more than Dynamo's router does.
- `kv_router`: Dynamo 1.6's KV router's cost with its defaults, in blocks of the trace's size:
  the prompt-side prefill load (the tokens of the prefills routed to the worker and not yet
  done, plus the request's prompt, less a credit for the prefix the worker holds: each block 1
  where its device holds it, 0.75 where its host memory does, 0.25 a lower tier, as Dynamo's
  `overlap_score_credit`, `host_cache_hit_weight` and `disk_cache_hit_weight`; at least 0),
  plus its decode load (the distinct whole prompt blocks of the requests active there, the new
  one's included: Dynamo's `router_assume_kv_reuse`, its output not counted:
  `router_track_output_blocks` off). The lowest cost wins; among equal costs one is drawn at
  random, as Dynamo's temperature 0 draws (from a seeded generator: the same routes each run).
  Against Dynamo's replay given the same times, the draws bring kvbench's reuse nearer Dynamo's
  mean than the lowest index did (docs/sizing.md). A request's prefill load lasts until its prefill
  ends and its blocks until it ends, both as the engine's cost model places it on its worker
  (queued prefills, then its own, then its output tokens' decode).

For both, a worker's caches are simulated as the router sees them: an LRU per per-worker tier
(for `prefix`, the fastest's only; Dynamo's router hears of host offloads too: fleet._routes),
every block the worker computes or loads written to it. A block's holders are indexed, so a
request is weighed only against the workers that hold its first block and the one that would
cost least without it; its cost is a walk of its blocks per candidate.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from harness.sizing.simulate import Cost
from harness.sizing.stack import References

ROUTINGS = ("round_robin", "prefix", "kv_router")
# Dynamo's KV router's credit for a prefix block held on a worker, by the tier holding it (its
# defaults: overlap_score_credit for the device, host_cache_hit_weight, disk_cache_hit_weight)
CACHE_HIT_CREDIT = {"G1": 1.0, "G2": 0.75, "G3": 0.25, "G4": 0.25}


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
    caches = [[_Cache(capacity_blocks)] for _ in range(workers)]
    holders: dict[int, set[int]] = {}
    free_at = np.zeros(workers)  # when each worker's queued prefills end
    out = np.empty(refs.requests, dtype=np.int64)
    blocks, serves = refs.blocks.tolist(), refs.serves.tolist()
    for i in range(refs.requests):
        lo, hi = int(starts[i]), int(starts[i + 1])
        mine, n, t = blocks[lo:hi], int(prompt_tokens[i]), float(arrival_s[i])
        # the tokens of each holder's prefix (the blocks that can serve: the prompt's last cannot)
        cached = {w: sum(serves[lo : lo + h]) for w, (_, h) in _credited_prefix(mine, holders, caches, (1.0,)).items()}
        soonest = int(np.argmin(free_at))
        cached.setdefault(soonest, 0)
        best = min(
            cached,
            key=lambda w: (max(float(free_at[w]), t) + cost.prefill_s(n, cached[w]), float(free_at[w]), w),
        )
        free_at[best] = max(float(free_at[best]), t) + cost.prefill_s(n, cached[best])
        _write(caches[best][0], best, mine, holders)
        out[i] = best
    return out


def kv_router(
    refs: References,
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    block_tokens: int,
    workers: int,
    tiers: Sequence[tuple[int, float]],
    cost: Cost,
    seed: int = 0,
) -> np.ndarray:
    """Each request's worker by Dynamo's KV router's cost (see the module's docstring); `tiers`:
    each per-worker tier's capacity in blocks and credit (CACHE_HIT_CREDIT), fastest first;
    `seed`, of the draws among workers of equal cost."""
    starts = np.searchsorted(refs.request, np.arange(refs.requests + 1))
    caches = [[_Cache(capacity) for capacity, _ in tiers] for _ in range(workers)]
    credits = [credit for _, credit in tiers]
    holders: dict[int, set[int]] = {}  # (of the largest tier: with inclusive LRUs, every tier's)
    largest = int(np.argmax([capacity for capacity, _ in tiers])) if tiers else 0
    free_at = np.zeros(workers)  # when each worker's queued prefills end
    load = _Load(workers, block_tokens)
    ties = np.random.default_rng(seed)  # (Dynamo draws among equal costs at random)
    out = np.empty(refs.requests, dtype=np.int64)
    blocks = refs.blocks.tolist()
    for i in range(refs.requests):
        lo, hi = int(starts[i]), int(starts[i + 1])
        mine, n, t = blocks[lo:hi], int(prompt_tokens[i]), float(arrival_s[i])
        load.until(t)
        held = _credited_prefix(mine, holders, caches, credits) if tiers else {}
        logits = {w: load.cost(w, n, mine, c) for w, (c, _) in held.items()}
        # a worker holding nothing of the request costs its load, the prompt and all its blocks
        # (none of them active there: its caches, which hold every active block, lack the first):
        # the least loaded, one cost for all of them (a fleet's idle workers, hundreds at a time)
        least = load.least()
        fresh = least + n / block_tokens + len(mine)
        cheapest = min(logits.values(), default=math.inf)
        idle = [w for w in load.at(least) if w not in held] if fresh <= cheapest else []
        low = fresh if idle else cheapest  # (no idle one: every least loaded worker holds some)
        best = _draw(sorted([w for w in logits if logits[w] == low] + idle), ties)
        computed = max(1, n - held.get(best, (0.0, 0))[1] * block_tokens)  # (one token at least)
        free_at[best] = prefilled = max(float(free_at[best]), t) + cost.prefill_s(n, n - computed)
        load.add(best, i, mine, computed, prefilled, prefilled + int(output_tokens[i]) * cost.decode_s)
        for k, c in enumerate(caches[best]):
            _write(c, best, mine, holders if k == largest else None)
        out[i] = best
    return out


def _draw(tied: list[int], rng: np.random.Generator) -> int:
    """One of the workers of equal least cost, at random as Dynamo's router draws (its
    temperature 0); no draw where one alone costs least, so that a request with a clear best
    does not move the draws of those after it."""
    return tied[0] if len(tied) == 1 else tied[int(rng.integers(len(tied)))]


class _Load:
    """What Dynamo's KV router counts as each worker's load: the prompt tokens of its prefills
    not yet done (`prefill`), and the distinct whole prompt blocks of its requests not yet ended
    (`active`, each block with the count of those requests holding it), until the times the
    cost model gives (`ends`: (when, 0 a prefill's end or 1 a request's, worker, request)); and
    the two together in blocks (`load`, kept as they change, to take the least of at once)."""

    __slots__ = ("active", "block_tokens", "ends", "load", "prefill", "prompts", "tokens")

    def __init__(self, workers: int, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.prefill = [0.0] * workers
        self.active: list[dict[int, int]] = [{} for _ in range(workers)]
        self.load = np.zeros(workers)
        self.ends: list[tuple[float, int, int, int]] = []
        self.prompts: dict[int, list[int]] = {}  # each request's blocks while it is active
        self.tokens: dict[int, int] = {}  # each request's prefill tokens until its prefill ends

    def until(self, t: float) -> None:
        """Every prefill and request that has ended by t taken off its worker's load."""
        while self.ends and self.ends[0][0] <= t:
            _, kind, w, i = heapq.heappop(self.ends)
            if kind == 0:
                self.prefill[w] -= self.tokens.pop(i)
            else:
                active = self.active[w]
                for b in self.prompts.pop(i):
                    active[b] -= 1
                    if not active[b]:
                        del active[b]
            self.load[w] = self.prefill[w] / self.block_tokens + len(self.active[w])

    def least(self) -> float:
        """The least load of a worker."""
        return float(self.load.min())

    def at(self, load: float) -> list[int]:
        """The workers whose load is `load`."""
        return np.flatnonzero(self.load == load).tolist()

    def cost(self, w: int, n: int, blocks: list[int], credit: float) -> float:
        """Worker w's cost for a request of n prompt tokens whose held prefix earns `credit`."""
        active = self.active[w]
        new = sum(1 for b in blocks if b not in active)
        return max(0.0, (self.prefill[w] + n) / self.block_tokens - credit) + len(active) + new

    def add(self, w: int, i: int, blocks: list[int], computed: int, prefilled: float, ended: float) -> None:
        """Request i on worker w: its `computed` tokens until its prefill ends, its blocks until it ends."""
        self.prefill[w] += computed
        self.tokens[i] = computed
        self.prompts[i] = blocks
        active = self.active[w]
        for b in blocks:
            active[b] = active.get(b, 0) + 1
        self.load[w] = self.prefill[w] / self.block_tokens + len(active)
        heapq.heappush(self.ends, (prefilled, 0, w, i))
        heapq.heappush(self.ends, (ended, 1, w, i))


def _credited_prefix(
    blocks: list[int], holders: dict[int, set[int]], caches: list[list[_Cache]], credits: Sequence[float]
) -> dict[int, tuple[float, int]]:
    """Per worker holding the request's first block: the credit of the longest prefix its tiers
    hold (each block the credit of the fastest tier holding it), and that prefix's length in
    blocks."""
    if not blocks or not holders.get(blocks[0]):
        return {}
    out: dict[int, tuple[float, int]] = {}
    for w in holders[blocks[0]]:
        credit, held = 0.0, 0
        for b in blocks:
            for k, cache in enumerate(caches[w]):
                if b in cache.blocks:
                    credit, held = credit + credits[k], held + 1
                    break
            else:
                break
        out[w] = (credit, held)
    return out


def _write(cache: _Cache, worker: int, blocks: list[int], holders: dict[int, set[int]] | None) -> None:
    """The request's blocks into the worker's cache (most recent last), evicting the least
    recently used past its capacity; `holders`, where given, kept up to date."""
    lru = cache.blocks
    for b in blocks:
        if b in lru:
            lru.move_to_end(b)
            continue
        lru[b] = None
        if holders is not None:
            holders.setdefault(b, set()).add(worker)
        if len(lru) > cache.capacity:
            old, _ = lru.popitem(last=False)
            if holders is not None:
                holders[old].discard(worker)
