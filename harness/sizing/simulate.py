"""A fleet's requests in virtual time (pure; docs/sizing.md, "Timing"): each request arrives when
the trace says, waits for its worker, loads its cached prefix from the tiers that hold it, then
prefills the rest; decoding overlaps the worker's next prefills. No wall clock: a heap of events.

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

import heapq
from collections import deque
from dataclasses import dataclass, field

import numpy as np


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


@dataclass
class Shared:
    """One tier instance's processor sharing: every load it serves gets bandwidth / n, so all
    advance alike in attained bytes `served` (per load, since time 0); a load is done when
    `served` reaches its target."""

    bandwidth: float
    served: float = 0.0
    at: float = 0.0
    active: list[tuple[float, int]] = field(default_factory=list)  # heap of (target, request)
    busy_since: float = 0.0

    def advance(self, now: float) -> None:
        if self.active:
            self.served += (now - self.at) * self.bandwidth / len(self.active)
        else:
            self.busy_since = now
        self.at = now

    def next_done(self) -> float | None:
        if not self.active:
            return None
        return self.at + max(0.0, self.active[0][0] - self.served) * len(self.active) / self.bandwidth


ARRIVE, LOADED, TRANSFERRED, PREFILLED = 0, 1, 2, 3
EPS_S = 1e-9  # two event times closer than this are the same moment (float rounding)


class Simulation:
    """The event loop of `simulate`: its state is the heap of events, each worker's queue, each
    request's progress through its loads, and each shared tier instance."""

    def __init__(self, reqs: Requests, tiers: list[Tier], kv_bytes_per_token: float, cost: Cost) -> None:
        self.reqs, self.tiers, self.kv, self.cost = reqs, tiers, kv_bytes_per_token, cost
        n = len(reqs.arrival_s)
        self.start, self.load, self.prefill, self.ttft = (np.zeros(n) for _ in range(4))
        self.stage = np.zeros(n, dtype=np.int64)  # the tier a request loads from next
        self.began = np.zeros(n)  # when its current transfer began (after the tier's latency)
        self.loads: list[list[tuple[int, float, float, float]]] = [[] for _ in tiers]
        self.delivered: list[list[tuple[float, float, float]]] = [[] for _ in tiers]
        self.instances: list[Shared] = []
        self.index: dict[tuple[int, int], int] = {}
        self.queues: dict[int, deque[int]] = {}
        self.busy: set[int] = set()
        self.events = [(float(reqs.arrival_s[i]), i, ARRIVE, i) for i in range(n)]
        heapq.heapify(self.events)
        self.seq = n

    def run(self) -> Result:
        handlers = {ARRIVE: self._arrive, LOADED: self._transfer, TRANSFERRED: self._transferred}
        while self.events:
            now, _, kind, what = heapq.heappop(self.events)
            handlers.get(kind, self._prefilled)(now, what)
        e2e = self.ttft + self.reqs.output_tokens * self.cost.decode_s
        loads = [np.asarray(x, dtype=np.float64).reshape(-1, 4) for x in self.loads]
        delivered = [np.asarray(x, dtype=np.float64).reshape(-1, 3) for x in self.delivered]
        return Result(self.start, self.load, self.prefill, self.ttft, e2e, loads, delivered)

    def _push(self, t: float, kind: int, what: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, what))

    def _arrive(self, now: float, i: int) -> None:
        w = int(self.reqs.worker[i])
        self.queues.setdefault(w, deque()).append(i)
        if w not in self.busy:
            self._serve(w, now)

    def _serve(self, worker: int, now: float) -> None:
        """The worker takes the oldest request waiting for it, if any."""
        queue = self.queues.get(worker)
        if queue:
            i = queue.popleft()
            self.busy.add(worker)
            self.start[i] = now
            self._next_load(i, now)

    def _next_load(self, i: int, now: float) -> None:
        """Request i's next load (after its tier's latency), or its prefill when none is left."""
        reqs, k = self.reqs, int(self.stage[i])
        while k < len(self.tiers) and reqs.tier_tokens[i, k] == 0:
            k += 1
        self.stage[i] = k
        if k == len(self.tiers):
            self.load[i] = now - self.start[i]
            self.prefill[i] = self.cost.prefill_s(int(reqs.prompt_tokens[i]), int(reqs.tier_tokens[i].sum()))
            self._push(now + self.prefill[i], PREFILLED, i)
            return
        self.began[i] = now + self.tiers[k].latency_s
        self._push(self.began[i], LOADED, i)

    def _bytes(self, i: int) -> float:
        return float(self.reqs.tier_tokens[i, self.stage[i]]) * self.kv

    def _transfer(self, now: float, i: int) -> None:
        k = int(self.stage[i])
        bandwidth = self.tiers[k].bandwidth
        if bandwidth is None:
            self.delivered[k].append((now, now, self._bytes(i)))
            self._loaded(i, now)
            return
        key = (k, int(self.reqs.instance[i, k]))
        if key not in self.index:
            self.index[key] = len(self.instances)
            self.instances.append(Shared(bandwidth))
        at = self.index[key]
        inst = self.instances[at]
        inst.advance(now)
        heapq.heappush(inst.active, (inst.served + self._bytes(i), i))
        self._push(inst.next_done() or now, TRANSFERRED, at)

    def _transferred(self, now: float, at: int) -> None:
        inst = self.instances[at]
        due = inst.next_done()
        if due is None or due > now + EPS_S:
            return  # set before a load joined or left: another event stands for the next end
        inst.advance(now)
        target, i = heapq.heappop(inst.active)
        inst.served = max(inst.served, target)
        if not inst.active:
            self.delivered[int(self.stage[i])].append((inst.busy_since, now, inst.bandwidth))
        self._loaded(i, now)
        if inst.active:
            self._push(inst.next_done() or now, TRANSFERRED, at)

    def _loaded(self, i: int, now: float) -> None:
        k = int(self.stage[i])
        self.loads[k].append((int(self.reqs.instance[i, k]), float(self.began[i]), now, self._bytes(i)))
        self.stage[i] = k + 1
        self._next_load(i, now)

    def _prefilled(self, now: float, i: int) -> None:
        self.ttft[i] = now - float(self.reqs.arrival_s[i])
        w = int(self.reqs.worker[i])
        self.busy.discard(w)
        self._serve(w, now)


def simulate(reqs: Requests, tiers: list[Tier], kv_bytes_per_token: float, cost: Cost) -> Result:
    """Every request's timing (the module's rules)."""
    return Simulation(reqs, tiers, kv_bytes_per_token, cost).run()
