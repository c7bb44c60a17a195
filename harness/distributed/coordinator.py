"""The coordinator of a distributed arm, whatever launched its workers: one model for `--workers`
(local processes, local.py) and `--ray` (actors, raypool.py).

Every worker takes its requests in batches from the arm's Dispatch (dispatch.py), which the
coordinator holds, and ships its finished records back as they end (worker.py). The coordinator
hears from each worker as events (messages.py: `Up`, `Records`, `Ended`, `Failed`, or `Lost` from
the launcher) and asks (`Want`, `ReadyAt`: answered to it as the Dispatch answers them), one at a
time from one queue: the records go into the arm's one requests.jsonl at once, and what it
tracks (progress, the ledger of schedule items and session turns) follows. It starts the arm's clock for all (`Go`)
and stops them all (`Stop`) the moment the run is told to stop.

A worker is lost when its launcher says so, when it fails, when it ends before its share ran out
though the run was not stopping (its pipe to its launcher closed: a worker never goes quiet by
itself), or when it says nothing for `lost_after_s` (not even a heartbeat, worker.HEARTBEAT_S):
silence judged after reading what has already come, and not counting the coordinator's own stalls
(a paused process, a VM pause) against the workers. A lost worker's requests that it took and did
not report are recorded as failed (`error_kind = "lost"`), and the others go on with the rest of
the schedule. Every arm ends by the ledger's rule (ledger.py): records + lost + unsent = scheduled,
or the arm fails saying by how much it is off. run.json's `distributed` names the workers, what
happened to them, and the count.

A launcher only places and supervises (`Pool`'s abstract methods): it starts the workers, carries
what they say to the coordinator's queue and what the coordinator says to one (`tell`), kills one,
and says where each runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from harness.core import aio
from harness.core.clock import ModelClock
from harness.core.errors import EndpointError
from harness.distributed.dispatch import CLOSED_BATCH_S, Dispatch, untagged
from harness.distributed.ledger import Ledger
from harness.distributed.messages import (
    Ended,
    Failed,
    Go,
    Items,
    Lost,
    ReadyAt,
    Records,
    Share,
    StartAt,
    Stop,
    Told,
    Up,
    Want,
)
from harness.distributed.worker import FLUSH_S, HEARTBEAT_S, ID_STRIDE, Outgoing, combine_health, deal
from harness.results import RequestRecord, RunWriter
from harness.workloads.base import Plan, Sender

# After the grace period of a stop (aio.GRACE_S), how long the coordinator still waits for the
# workers' last records before it records what they hold as lost (s).
END_WAIT_S = 5.0
# After a second Ctrl-C, how long it waits for the records of what the workers cut short: within
# aio.HURRY_S, after which the run is cancelled, with room left for the arm's accounting.
HURRIED_WAIT_S = aio.HURRY_S / 2


class Pool(ABC):
    """The arm of `sender` over `workers` (index -> its connections); records go into `sink` as
    they come and are put in start order at the end. `ready()` starts the workers and waits until
    each can send; `run(clock)` starts them all on `clock` (just started), and returns the
    workers' combined client health."""

    # how long the run waits for the pool once stopped (it stops its workers and bounds its own wait)
    grace_s: ClassVar[float] = aio.GRACE_S + END_WAIT_S + 1.0
    noun: ClassVar[str]  # what the progress line calls the workers
    one: ClassVar[str]  # what a message calls one of them
    engine: ClassVar[str]  # run.json distributed.engine
    flush_s: ClassVar[float] = FLUSH_S  # how often a worker ships its records (each ship costs a message)
    batch_s: ClassVar[float] = CLOSED_BATCH_S  # a closed loop's batch: this long at its pace (each costs an ask)

    def __init__(
        self, sender: Sender, kind: str, plan: Plan, sink: RunWriter, workers: list[int], lost_after_s: float
    ) -> None:
        """`workers`: their indexes (a Ray run keeps its workers' numbers over its arms)."""
        self.sender, self.kind, self.plan, self.sink, self.lost_after_s = sender, kind, plan, sink, lost_after_s
        spec = sender.spec
        dealt = deal(spec.connections, len(workers))
        self.shares = {
            k: Share(
                k,
                spec,
                kind,
                {},
                plan,
                dealt[pos],
                sum(dealt[:pos]),
                self.send_clock(k),
                self.flush_s,
                self.batch_s,
                lost_after_s,
            )
            for pos, k in enumerate(workers)
        }
        self.times = [spec.clock.wall_s(t) for t in plan.timed.times] if plan.timed else []
        self.table = Dispatch(list(plan.schedule), self.times, {k: s.connections for k, s in self.shares.items()})
        self.answering: set[asyncio.Task[None]] = set()  # asks the Dispatch has yet to answer (a start line)
        self.events: asyncio.Queue[tuple[int, Outgoing]] = asyncio.Queue()
        self.heard: dict[int, float] = {}  # worker -> when it was last heard from (monotonic s)
        self.looked = self.vouched = time.monotonic()  # when the silence rule last looked; when Alive last went out
        self.running: set[int] = set()  # started, neither ended nor lost
        self.up: set[int] = set()  # said they can send
        self.healths: dict[int, dict[str, Any]] = {}
        self.lost: dict[int, str] = {}  # worker -> why it is gone
        self.ledger = Ledger(kind, plan)
        self.faults: list[dict[str, Any]] = []
        self.started = self.stopping = self.hurried = False

    # -- what a launcher does ----------------------------------------------------------------

    @abstractmethod
    def send_clock(self, k: int) -> bool:
        """Whether worker k tells the embedded emulator when its requests left (on its host only)."""

    @abstractmethod
    async def start(self) -> None:
        """Start every worker of self.shares; each puts its events on self.events."""

    @abstractmethod
    async def tell(self, k: int, said: Told) -> None:
        """Carry `said` to worker k (no error if it is gone)."""

    @abstractmethod
    def vouch(self) -> None:
        """Tell each running worker the coordinator is there (messages.Alive), at least once a
        heartbeat (nothing, for a launcher whose own traffic carries it)."""

    @abstractmethod
    def kill(self, k: int) -> None:
        """Worker k is lost: make sure it sends nothing more."""

    @abstractmethod
    def where(self, k: int) -> dict[str, Any]:
        """Where worker k runs (run.json and messages): at least `hostname`."""

    @abstractmethod
    async def describe(self) -> dict[str, Any]:
        """run.json's `distributed`, but its faults."""

    # -- the arm -----------------------------------------------------------------------------

    async def ready(self) -> None:
        """Until every worker can send (or is lost, or the run is stopped). No limit on how long
        a worker takes to start (Python, kvbench's import, its client: slow on a busy host), only
        on its silence: its launcher vouches for it while it starts (`starting`)."""
        self.running, self.up = set(self.shares), set()
        await self.start()
        self.heard = dict.fromkeys(self.shares, time.monotonic())  # silence counts once started
        self.looked = time.monotonic()
        while self.running - self.up and not self.sender.stop.is_set():
            await self._next_event(self.sender.stop)
            self._watch()
        if not self.running:
            raise EndpointError(f"every worker was lost before the arm began: {'; '.join(self.lost.values())}")

    async def run(self, clock: ModelClock) -> dict[str, Any]:
        sender = self.sender
        sender.progress.start(f"{sender.spec.arm.name} ({len(self.shares)} {self.noun})", self.plan.total)
        self.started = True
        await asyncio.gather(*(self.tell(k, Go(clock.t0_ns)) for k in sorted(self.running)))
        try:
            while self.running and not sender.stop.now.is_set():
                if sender.stop.is_set() and not self.stopping:
                    await self._stop_all()
                await self._next_event(self._wake())
                self._watch()
        finally:
            try:
                await self._end()
            except asyncio.CancelledError:
                self._cut_short()
                raise
            finally:
                for task in self.answering:  # start lines of an arm that is over
                    task.cancel()
        healths = [self.healths[k] for k in sorted(self.healths)]
        out = combine_health(healths, len(self.shares)) if healths else {"processes": len(self.shares)}
        return {**out, "engine": self.engine}

    def _wake(self) -> asyncio.Event | None:
        """What the wait for the next event also ends on: the stop, then its hurry."""
        if not self.stopping:
            return self.sender.stop
        return None if self.hurried else self.sender.stop.now

    async def _next_event(self, wake: asyncio.Event | None) -> None:
        """Handle the next event, if one comes within a heartbeat (or before `wake` is set), and
        every other already come."""
        get = asyncio.ensure_future(self.events.get())
        waits: set[asyncio.Future[Any]] = {get}
        if wake is not None:
            waits.add(asyncio.ensure_future(wake.wait()))
        try:
            await asyncio.wait(waits, timeout=HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if get.done() and not get.cancelled():
            await self._handle(*get.result())
        while not self.events.empty():
            await self._handle(*self.events.get_nowait())

    async def _handle(self, k: int, event: Outgoing) -> None:
        if k not in self.running:  # a lost worker's last words: not counted, nor its asks answered
            return
        self.heard[k] = time.monotonic()
        match event:
            case Want() | ReadyAt():  # answered when the Dispatch has (a start line waits for the others)
                task = asyncio.ensure_future(self._answer(k, event))
                self.answering.add(task)
                task.add_done_callback(self.answering.discard)
            case Records(lines):
                self._record(lines)
            case Ended():
                await self._ended(k, event)
            case Failed(why) | Lost(why):
                await self._lose(k, why)
            case Up():
                self.up.add(k)

    def _record(self, data: bytes) -> None:
        if not data:
            return  # a heartbeat
        got = [untagged(line) for line in data.splitlines()]
        self.sink.add_lines([line for line, *_ in got])
        for _, ok, ttft, index, session in got:
            self.sender.progress.advance(ok, ttft)
            self.ledger.record(index, session)

    async def _ended(self, k: int, end: Ended) -> None:
        self.healths[k] = {**end.client_health, "worker": k, **self.where(k)}
        for w in end.warnings:
            if w not in self.sender.warnings:
                self.sender.warn(w)
        if end.aborted and not self.sender.aborted:
            self.sender.aborted = end.aborted
            self.sender.stop.set()
        if end.interrupted and not self.sender.stop.is_set():
            # it stopped short though nobody told it to: what it took and did not send is lost
            await self._lose(k, "it stopped before its share of the schedule ran out, though the run was not stopping")
            return
        self.running.discard(k)
        self.table.gone(k)

    async def _answer(self, k: int, ask: Want | ReadyAt) -> None:
        told = await self.table.answer(ask)
        assert isinstance(told, Items | StartAt), told
        await self.tell(k, told)

    def starting(self, k: int) -> bool:
        """Worker k's launcher vouches for it while it starts (its process lives and has not said
        it is up; a Ray worker's actor then vouches with heartbeats of its own)."""
        return False

    def _watch(self) -> None:
        """Workers silent for lost_after_s are lost (found here, handled as their event); of those
        not yet up, only one whose launcher no longer vouches for it. The coordinator looks at
        least once a heartbeat: a longer gap is its own stall (a paused process, swap, a VM
        pause), during which it heard nobody, and does not count as the workers' silence."""
        now = time.monotonic()
        if (stall := now - self.looked - HEARTBEAT_S) > 0:
            for k in self.heard:
                self.heard[k] += stall
        self.looked = now
        if now - self.vouched >= HEARTBEAT_S / 2:
            self.vouched = now
            self.vouch()
        for k in sorted(self.running):
            if k not in self.up and self.starting(k):
                self.heard[k] = now
            if now - self.heard[k] > self.lost_after_s:
                self.kill(k)
                self.heard[k] = now  # one event, not one per look
                silent = Lost(f"it sent neither records nor a heartbeat for {self.lost_after_s:g} s")
                self.events.put_nowait((k, silent))

    async def _stop_all(self, now: bool = False) -> None:
        self.stopping, self.hurried = True, self.hurried or now
        await asyncio.gather(*(self.tell(k, Stop(now)) for k in sorted(self.running)))

    async def _lose(self, k: int, reason: str) -> None:
        """Worker k is gone: what it took and did not report is recorded as failed."""
        self.running.discard(k)
        self.lost[k] = reason
        self.kill(k)
        self.table.gone(k)
        taken = self.table.taken(k)
        at_s = self.sender.spec.clock.since_start(time.perf_counter_ns()) if self.started else 0.0
        lost = [self._lost_record(k, i, p, extra, at_s, reason) for i, p, extra in self.ledger.lose(taken)]
        for r in lost:
            self.sink.add(r)
            self.sender.progress.advance(False, None)
        where = self.where(k)
        self.faults.append({"worker": k, **where, "at_s": at_s, "reason": reason, "lost_requests": len(lost)})
        others = bool(self.running)
        self.sender.warn(
            f"{self.one} {k} on {where['hostname']} was lost: {reason}; the {len(lost)} request(s) it had taken "
            "and not reported are recorded as failed" + (", the others go on" if others else "")
        )
        if not others and not self.stopping and not self.sender.aborted:
            self.sender.aborted = "every worker was lost"
            self.sender.stop.set()

    def _lost_record(self, k: int, i: int, p: int, extra: dict[str, Any], at_s: float, reason: str) -> RequestRecord:
        """The failed record of a request worker k took as schedule item i (prompt p) and did not
        report: a request, or a session's turn (`extra`: its record fields)."""
        plan, spec = self.plan, self.sender.spec
        prompt = plan.prompts[p]
        self.sender.seq += 1
        return RequestRecord(
            id=(max(self.shares) + 2) * ID_STRIDE + self.sender.seq,  # unique until renumbered
            arm=spec.arm.name,
            phase="warmup" if plan.timed and i < plan.timed.warmup else "run",
            prompt_id=prompt.id,
            target_tokens=prompt.target_tokens,
            prompt_tokens=None,
            cached_tokens=None,
            completion_tokens=None,
            start_s=at_s,
            ttft_s=None,
            first_byte_s=None,
            first_content_s=None,
            headers_s=None,
            e2e_s=None,
            itl_s=[],
            ok=False,
            error=f"lost with {self.one} {k} ({reason}): it was in flight or about to be sent",
            error_kind="lost",
            http_status=None,
            retried=False,
            process=k,
            **extra,
        )

    def _cut_short(self) -> None:
        """Stopped at once (Ctrl-C pressed again) before the workers' last records came: run.json
        still says who sent, what was lost and how the count stands, with what was neither
        recorded nor lost counted unsent though some of it may have been in flight and answered
        (`cut_short`), and a warning says so."""
        count = self.ledger.close(stopped=True)
        workers = [{"worker": k, **self.where(k), "lost": self.lost.get(k)} for k in sorted(self.shares)]
        accounting = {**count.meta(), "cut_short": True}
        self.sink.meta.setdefault(
            "distributed", {"engine": self.engine, "workers": workers, "faults": self.faults, "accounting": accounting}
        )
        if count.unsent:
            self.sender.warn(
                f"stopped at once before the workers' last records came: {count.unsent} request(s) have no record "
                "and are counted unsent, though those in flight may have been answered"
            )

    async def _end(self) -> None:
        """Stopped early or done: every worker stops, and what they send is kept (bounded; told
        to stop at once, they cut what is in flight short and ship its records, HURRIED_WAIT_S)."""
        if self.running:
            await self._stop_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(aio.GRACE_S + END_WAIT_S) as deadline:
                    while self.running:
                        if self.sender.stop.now.is_set() and not self.hurried:
                            await self._stop_all(now=True)
                            hurried_by = asyncio.get_running_loop().time() + HURRIED_WAIT_S
                            deadline.reschedule(min(hurried_by, deadline.when() or hurried_by))
                        await self._next_event(self._wake())
                        self._watch()
        while not self.events.empty():  # said before it ended
            await self._handle(*self.events.get_nowait())
        waited = (
            f"{HURRIED_WAIT_S:g} s of being told to stop at once (Ctrl-C pressed again)"
            if self.hurried
            else f"{aio.GRACE_S + END_WAIT_S:g} s"
        )
        for k in sorted(self.running):  # did not stop in time: what it holds is lost with it
            await self._lose(k, f"it did not stop within {waited}")
        count = self.ledger.close(stopped=self.stopping or self.sender.stop.is_set())
        if (problem := count.problem()) is not None:
            self.sender.warn(f"the arm's count does not add up: {problem}")
            self.sender.aborted = self.sender.aborted or f"the arm's count does not add up: {problem}"
        self.sink.reorder()
        self.sink.meta["distributed"] = {**await self.describe(), "faults": self.faults, "accounting": count.meta()}
