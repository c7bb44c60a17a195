"""The schedule of a distributed arm, shared by its workers: the coordinator's side (`Dispatch`:
who takes which request, an open loop's start line) and a worker's side (`FedOrder`: the batches
it asks for, sized by its pace). Plain Python with no transport: the coordinator holds the
Dispatch and answers its workers' asks, which their launchers carry as they carry the rest.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.config import kinds
from harness.distributed.messages import (
    Ask,
    Item,
    Items,
    ReadyAt,
    StartAt,
    Want,
)
from harness.results import RequestRecord
from harness.workloads.base import Schedule

# Requests a worker takes from the schedule at once. A closed loop's: what its client sends in its
# launcher's Pool.batch_s (CLOSED_BATCH_S `--workers`', raypool.RAY_BATCH_S Ray's) at the pace it
# has kept since its last batch, at least CLOSED_BATCH times as many as it has connections (its
# first batch, and at a slow pace: a worker lost takes the batch with it) and at most MAX_BATCH;
# at most a GUIDED-th of its share of what is left (with others still there), so that none holds
# many at the end; the next batch is asked for when half of one is left. An open loop's: its own
# requests due within OPEN_WINDOW_S (wall-clock) of the first (at most MAX_BATCH), the next asked
# for when less than half a window is left: an ask may take tens of milliseconds on a loaded host
# without a send waiting for it. (At 2,500 req/s, batches of 8x a worker's connections over Ray
# took a point more of its core than batches of a quarter second, measured; the sizes also bound
# what a lost worker takes with it.)
CLOSED_BATCH = 8
CLOSED_BATCH_S = 0.25
MAX_BATCH = 4096
GUIDED = 4
OPEN_WINDOW_S = 0.2
# How long after the last worker is ready for an open loop's measured part it starts (ns): time
# for every worker to hear of it before its first send is due.
START_MARGIN_NS = 50_000_000


class Dispatch:
    """The schedule, shared by the workers of one arm (one call at a time: the coordinator's own
    event loop).

    A closed loop's requests (and sessions) go to whichever worker asks next. An open loop's are
    dealt to the workers in turn, weighted by their connections, and each worker takes its own by
    time windows; a worker that is lost leaves its untaken ones to the others. It remembers what
    each worker took, for the requests a lost worker takes with it, and holds an open loop's start
    line: the measured part starts once every worker still there has its warm-up answered."""

    def __init__(self, order: list[Item], times_wall_s: list[float], workers: dict[int, int]) -> None:
        """An arm's schedule, and its workers with their connections."""
        self.line = _Line()
        self.order, self.times, self.weights = order, times_wall_s, workers
        self.next = 0
        self.given: dict[int, list[Item]] = {k: [] for k in workers}
        self.last: dict[int, tuple[int, list[Item]]] = {}  # worker -> its last ask's number, and what it got
        self.ready: dict[int, int] = {}  # worker -> when it was ready (coordinator ns)
        self.gone_workers: set[int] = set()
        self.own: dict[int, deque[Item]] = {k: deque() for k in workers}
        if times_wall_s:
            for k, items in in_turn(order, workers).items():
                self.own[k].extend(items)

    async def answer(self, ask: Ask) -> Items | StartAt:
        """A worker's ask (messages.py), answered."""
        match ask:
            case Want(worker, n, seq):
                return Items(self.take(worker, n, seq), seq)
            case ReadyAt(worker, ns):
                return StartAt(await self.start_line(worker, ns))

    def take(self, worker: int, n: int, seq: int | None = None) -> list[Item]:
        """Up to n of this worker's next requests: of a closed loop, fewer as the schedule runs out
        if other workers are still there (guided self-scheduling); of an open loop, its own due
        within OPEN_WINDOW_S of the first. None to a worker declared gone. The ask numbered `seq`
        asked again (its answer lost on the way) gets what it got then."""
        if worker in self.gone_workers or worker not in self.given:
            return []
        if seq is not None and (prior := self.last.get(worker)) is not None and prior[0] == seq:
            return prior[1]
        if self.times:
            own, times = self.own[worker], self.times
            got: list[Item] = []
            if own:
                last = times[own[0][0]] + OPEN_WINDOW_S
                while own and len(got) < n and times[own[0][0]] <= last:
                    got.append(own.popleft())
        else:
            left = len(self.order) - self.next
            if (live := len(self.given) - len(self.gone_workers)) > 1:  # one alone has nobody to wait for
                n = max(1, min(n, -(-left // (GUIDED * live))))
            got = self.order[self.next : self.next + n]
            self.next += len(got)
        self.given[worker] += got
        if seq is not None:
            self.last[worker] = (seq, got)
        return got

    def taken(self, worker: int) -> list[Item]:
        return self.given.get(worker, [])

    async def start_line(self, worker: int, ready_ns: int) -> int:
        """Worker ready for an open loop's measured part (its warm-up answered, coordinator ns):
        the measured part's start (coordinator ns, a margin after the latest one ready), once every
        worker still there is ready."""
        line = self.line
        self.ready[worker] = ready_ns
        self._check_line()
        await line.reached.wait()
        return line.at if line.at is not None else ready_ns  # None: the arm was over

    def gone(self, worker: int) -> None:
        """A worker that is done or lost: nobody waits for it at the start line, and the open-loop
        requests it had not taken go to the others still there (to none if none is: they stay its
        own, and are lost with it)."""
        self.gone_workers.add(worker)
        self._check_line()
        left = {k: w for k, w in self.weights.items() if k not in self.gone_workers}
        if self.own.get(worker) and left:
            for k, items in in_turn(list(self.own[worker]), left).items():
                self.own[k] = deque(heapq.merge(self.own[k], items))
            self.own[worker].clear()

    def _check_line(self) -> None:
        if self.ready and set(self.ready) | self.gone_workers >= set(self.given) and self.line.at is None:
            self.line.at = max(self.ready.values()) + START_MARGIN_NS
            self.line.reached.set()


@dataclass
class _Line:
    """An arm's start line, once reached (coordinator ns)."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    at: int | None = None


def in_turn(items: list[Item], weights: dict[int, int]) -> dict[int, list[Item]]:
    """`items` dealt to the workers in turn, each in proportion to its weight (smooth weighted
    round robin: a worker of weight 2 gets every other turn of one of weight 1 beside two of it)."""
    total = sum(weights.values())
    credit = dict.fromkeys(weights, 0)
    cycle = []
    for _ in range(total):
        for k, w in weights.items():
            credit[k] += w
        k = max(credit, key=lambda c: credit[c])
        credit[k] -= total
        cycle.append(k)
    out: dict[int, list[Item]] = {k: [] for k in weights}
    for j, item in enumerate(items):
        out[cycle[j % total]].append(item)
    return out


class FedOrder(Schedule):
    """A worker's side of the schedule: batches it asks the Dispatch for (the next asked for while
    half of the last one, or of an open loop's window, is left; a closed loop's sized by the pace
    the worker keeps), and an open loop's start line, on this host's clock here and on the
    coordinator's (offset_ns behind) in what it tells (`tell`, a message for the Dispatch);
    `arrive` and `start_at` are called as the answers come."""

    def __init__(
        self,
        tell: Callable[[Want | ReadyAt], None],
        worker: int,
        times_wall_s: list[float],
        kind: str,
        connections: int,
        offset_ns: int,
        batch_s: float = CLOSED_BATCH_S,  # a closed loop's batch: what it sends in this long
        clock: Callable[[], int] = time.perf_counter_ns,  # the pace's clock (a test's own)
        quiet_ns: int | None = None,  # hold after this long without a word from the coordinator
    ) -> None:
        super().__init__(())
        self.tell, self.worker, self.times, self.connections = tell, worker, times_wall_s, connections
        self.clock = clock
        self.seq = 0  # its asks' numbers
        self.answered = 0  # the last ask answered
        self.batch_s = batch_s
        self.limit = kinds.get(kind).batch_limit
        self.offset_ns = offset_ns
        self.buf: deque[Item] = deque()
        self.came = asyncio.Event()
        self.line: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.asked = self.done = False
        self.low = 0
        self.asked_ns: int | None = None  # when the last batch was asked for, and how many were handed out since
        self.handed = 0
        self.quiet_ns, self.heard_ns = quiet_ns, clock()
        self.word = asyncio.Event()
        self.ended = False

    def hear(self) -> None:
        """A fresh word from the coordinator (`Alive`, `Go`; not an answer, which may have been
        on its way since before the worker was declared lost)."""
        self.heard_ns = self.clock()
        self.word.set()

    def end(self) -> None:
        """Stopped: nothing more is handed out, what it holds included (taken and not sent: the
        coordinator counts it). A stop wakes a worker the switch holds, and that must not send
        what it held: a thawed worker, stopped once its pipe closed, sent it."""
        self.ended = self.done = True
        self.buf.clear()
        self.word.set()
        self.came.set()

    def arrive(self, got: list[Item], seq: int) -> None:
        """The answer to ask `seq`; told again (a call made again after its reply was lost), or
        to an earlier ask, it changes nothing."""
        if seq <= self.answered:
            return
        self.answered = seq
        self.asked, self.done = False, not got
        self.buf.extend(got)
        self.low = len(got) // 2
        self.came.set()

    def start_at(self, ns: int) -> None:
        """The start line has come (coordinator ns)."""
        if not self.line.done():
            self.line.set_result(ns + self.offset_ns)

    async def __anext__(self) -> Item:
        while not self.ended:
            if self.quiet_ns is not None and self.clock() - self.heard_ns > self.quiet_ns:
                # no word from the coordinator for the liveness bound: it may be dead, cut off
                # or paused; nothing new is sent until it speaks again (checked again after
                # every wait: items may come from the Dispatch while it is silent)
                self.word.clear()
                await self.word.wait()
            elif self.buf:
                break
            elif self.done:
                raise StopAsyncIteration
            else:
                self._ask()
                self.came.clear()
                await self.came.wait()
        if self.ended:
            raise StopAsyncIteration
        item = self.buf.popleft()
        self.handed += 1
        if not self.done and self._low(item[0]):
            self._ask()
        return item

    def _low(self, i: int) -> bool:
        """Time to ask for more, with item i handed out."""
        if not self.buf:
            return True
        if self.times:
            return self.times[self.buf[-1][0]] - self.times[i] < OPEN_WINDOW_S / 2
        return len(self.buf) <= self.low

    def _ask(self) -> None:
        if not self.asked:
            self.asked = True
            now = self.clock()
            self.seq += 1
            self.tell(Want(self.worker, self.wanted(now), self.seq))
            self.asked_ns, self.handed = now, 0

    def wanted(self, now_ns: int) -> int:
        """How many to ask for next (the Dispatch may give fewer), at most the kind's batch limit."""
        want = self._wanted(now_ns)
        return want if self.limit is None else min(want, self.limit)

    def _wanted(self, now_ns: int) -> int:
        if self.times:
            return MAX_BATCH  # the Dispatch gives this worker's next window
        least = CLOSED_BATCH * self.connections
        if self.asked_ns is None or now_ns <= self.asked_ns:
            return least
        pace = self.handed * 1e9 / (now_ns - self.asked_ns)
        return max(least, min(MAX_BATCH, math.ceil(pace * self.batch_s)))

    async def measured_start(self, ready_ns: int) -> int:
        self.tell(ReadyAt(self.worker, ready_ns - self.offset_ns))
        return await self.line


def tagged(r: RequestRecord) -> bytes:
    """A record as a worker sends it: what the coordinator tracks (ok, ttft, schedule index,
    session), then the record, one line, so that the coordinator parses no JSON."""
    meta = [int(r.ok), r.ttft_s, r.schedule_index, r.session]
    return b" ".join(b"-" if v is None else repr(v).encode() for v in meta) + b"\t" + r.to_json() + b"\n"


def untagged(line: bytes) -> tuple[bytes, bool, float | None, int | None, int | None]:
    meta, _, record = line.partition(b"\t")
    ok, ttft, index, session = (None if v == b"-" else v for v in meta.split(b" "))
    return (
        record,
        ok == b"1",
        None if ttft is None else float(ttft),
        None if index is None else int(index),
        None if session is None else int(session),
    )
