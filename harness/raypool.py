"""`kvbench run --ray [ADDRESS]`: an arm sent by Ray actors on any number of client hosts.

The coordinator (this process, Ray's driver) settles the plan as for one process. A `Dispatch`
actor beside it holds the schedule: each worker takes its next requests from it in batches that
shrink as the schedule runs out (`take`), so whichever worker is free takes the next closed-loop
request (give or take a batch), an open loop's requests
are sent by whoever took them at their time on the coordinator's clock, and a session (one
schedule item) stays with one worker. Each `RayWorker` actor is a client exactly like one
`--workers` process (workers.send_share, on uvloop, in a thread of its own) and keeps its finished
records until the coordinator drains them, every POLL_S, into the arm's one requests.jsonl.

Clocks: before and after each arm the coordinator measures each worker's monotonic clock against
its own (round trips, clock.Offset) and hands the worker the arm's start on the worker's clock,
so records and send times are on the coordinator's time line; run.json keeps the offsets with
their uncertainty and drift.

Faults: a worker whose actor or node dies is found by its failed calls; the requests it had
taken and not reported are recorded as failed (`error_kind = "lost"`), the others go on with the
rest of the schedule, and run.json's `distributed.faults` says what happened. Ctrl-C stops every
worker, which finish what is in flight (aio.GRACE_S) and are drained.

Only this module imports Ray, and only once `--ray` is given (`pip install 'kvbench[ray]'`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import re
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from harness import aio
from harness.clock import CLOCK_WARN_NS, ModelClock, Offset
from harness.errors import EndpointError, InputError
from harness.results import RequestRecord, RunWriter, versions
from harness.workers import ID_STRIDE, Share, combine_health, deal, send_share
from harness.workloads.base import Plan, Schedule, Sender

INSTALL_HINT = "pip install 'kvbench[ray]' (on this host and on every client host of the cluster)"
# How often the coordinator drains the workers' records (s): what a dying worker can take with it
# unreported (recorded as lost), against a few Ray calls per worker each time (0.1 s cost a
# tenth of a loaded core).
POLL_S = 0.25
# Round trips per clock-offset measurement.
CLOCK_TRIPS = 16
# A worker's client must be up within this long (s); a cluster without room for an actor never is.
READY_TIMEOUT_S = 120.0
# Requests a worker takes from the schedule at once: a closed loop's, CLOSED_BATCH times as many
# as it has connections; an open loop's, those due within OPEN_LOOKAHEAD_S (wall-clock) of the
# first, at most OPEN_BATCH; either, at most a GUIDED-th of its share of what is left, so that
# none holds many at the end. Fewer, larger calls: each costs the worker's core a few
# context switches through Ray's threads.
CLOSED_BATCH = 4
OPEN_BATCH = 256
OPEN_LOOKAHEAD_S = 0.05
GUIDED = 4
# How often a worker asks whether every worker has its open loop's warm-up answered (s), and how
# long after the last one was ready the measured part starts (ns): time for every worker to
# learn it through Ray before its first send is due.
START_POLL_S = 0.001
START_MARGIN_NS = 20_000_000
# Concurrent calls an actor serves: its run, and the coordinator's drain, stop and clock calls.
ACTOR_THREADS = 4


def require() -> None:
    """Exit 2 with the way to install Ray when it is missing."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError(f"--ray: Ray is not installed: {INSTALL_HINT}") from None


class Dispatch:
    """The schedule, shared by the workers of one arm (a Ray actor beside the coordinator, serving
    one call at a time; plain Python, so that it can be tested without Ray). It remembers what
    each worker took, for the requests a lost worker takes with it, and holds an open loop's start
    line: the measured part starts once every worker still there has its warm-up answered."""

    def __init__(self, order: list[tuple[int, int]], times_wall_s: list[float], workers: list[int]) -> None:
        self.reset(order, times_wall_s, workers)

    def reset(self, order: list[tuple[int, int]], times_wall_s: list[float], workers: list[int]) -> None:
        """A new arm's schedule (the actor serves every arm of the run)."""
        self.order, self.times = order, times_wall_s
        self.next = 0
        self.given: dict[int, list[tuple[int, int]]] = {k: [] for k in workers}
        self.ready: dict[int, int] = {}  # worker -> when it was ready (coordinator ns)
        self.gone_workers: set[int] = set()

    def take(self, worker: int, n: int) -> list[tuple[int, int]]:
        """Up to n of the next requests, fewer as the schedule runs out (guided self-scheduling:
        a GUIDED-th of each worker's share of what is left, so that none holds many at the end),
        and of an open loop only those due within OPEN_LOOKAHEAD_S of the first."""
        left = len(self.order) - self.next
        n = max(1, min(n, -(-left // (GUIDED * len(self.given)))))
        end = min(len(self.order), self.next + n)
        if self.times and self.next < end:
            last = self.times[self.order[self.next][0]] + OPEN_LOOKAHEAD_S
            end = next((j for j in range(self.next + 1, end) if self.times[self.order[j][0]] > last), end)
        got = self.order[self.next : end]
        self.next = end
        self.given[worker] += got
        return got

    def taken(self, worker: int) -> list[tuple[int, int]]:
        return self.given[worker]

    def arrive(self, worker: int, ready_ns: int) -> None:
        """Worker ready for an open loop's measured part (its warm-up answered), coordinator ns."""
        self.ready[worker] = ready_ns

    def gone(self, worker: int) -> None:
        """A worker that is done or lost: nobody waits for it at the start line."""
        self.gone_workers.add(worker)

    def start_line(self) -> int | None:
        """The measured part's start (coordinator ns, the latest ready), once every worker still
        there is ready; None before."""
        if self.ready and set(self.ready) | self.gone_workers >= set(self.given):
            return max(self.ready.values()) + START_MARGIN_NS
        return None


class RemoteOrder(Schedule):
    """A worker's side of the Dispatch: batches taken as its connections need them (one call
    for all that wait; the next is asked for when a quarter of the last one is left), an open
    loop's start line converted to this worker's clock."""

    def __init__(self, dispatch: Any, worker: int, batch: int, offset_ns: int) -> None:
        super().__init__(())
        self.dispatch, self.worker, self.batch, self.offset_ns = dispatch, worker, batch, offset_ns
        self.buf: deque[tuple[int, int]] = deque()
        self.fetching: asyncio.Future[None] | None = None
        self.done = False
        self.low = 0

    async def __anext__(self) -> tuple[int, int]:
        while not self.buf:
            if self.done:
                raise StopAsyncIteration
            await asyncio.shield(self._fetching())
        if len(self.buf) <= self.low and not self.done:
            self._fetching()
        return self.buf.popleft()

    def _fetching(self) -> asyncio.Future[None]:
        if self.fetching is None:
            self.fetching = asyncio.ensure_future(self._fetch())
        return self.fetching

    async def _fetch(self) -> None:
        try:
            # Submitting a Ray call can wait milliseconds for Ray's own threads on a busy core:
            # done off the event loop, which goes on reading streams meanwhile.
            ref = await asyncio.to_thread(self.dispatch.take.remote, self.worker, self.batch)
            got = await ref
        finally:
            self.fetching = None
        self.done = not got
        self.buf.extend(got)
        self.low = len(got) // 4  # the next is asked for when a quarter of this one is left

    async def measured_start(self, ready_ns: int) -> int:
        await self.dispatch.arrive.remote(self.worker, ready_ns - self.offset_ns)
        while (line := await self.dispatch.start_line.remote()) is None:
            await asyncio.sleep(START_POLL_S)
        return int(line) + self.offset_ns


class RayWorker:
    """One client of the arm on a Ray node (decorated as an actor by `connect`). Its client runs
    on an event loop of its own in the thread of `run`; the coordinator's other calls (clock,
    drain, stop) are served by other threads meanwhile."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.out: deque[tuple[bytes, bool, float | None, int | None, int | None]] = deque()
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.go_at: asyncio.Future[int] | None = None

    def info(self) -> dict[str, Any]:
        import ray

        return {
            "hostname": platform.node(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "cores": os.cpu_count(),
            "kvbench": versions()["kvbench"],
        }

    def now(self) -> int:
        return time.perf_counter_ns()

    def run(self, share: Share, headers: dict[str, str], dispatch: Any, batch: int, offset_ns: int) -> dict[str, Any]:
        try:
            return aio.run(_send(self, replace(share, headers=headers), dispatch, batch, offset_ns))
        finally:
            self.ready.clear()  # until the next arm's client is up

    def wait_ready(self, timeout_s: float) -> bool:
        return self.ready.wait(timeout_s)

    def go(self, t0_ns: int) -> None:
        """Start the arm's clock at t0_ns of this worker's clock."""
        assert self.loop is not None and self.go_at is not None
        self.loop.call_soon_threadsafe(_resolve, self.go_at, t0_ns)

    def stop(self) -> None:
        if self.loop is not None and self.stop_event is not None:
            with contextlib.suppress(RuntimeError):  # its loop has ended already
                self.loop.call_soon_threadsafe(self.stop_event.set)
            if self.go_at is not None:  # stopped before the start: it starts, to stop at once
                with contextlib.suppress(RuntimeError):
                    self.loop.call_soon_threadsafe(_resolve, self.go_at, time.perf_counter_ns())

    def drain(self) -> list[tuple[bytes, bool, float | None, int | None, int | None]]:
        got = []
        with contextlib.suppress(IndexError):
            while True:
                got.append(self.out.popleft())
        return got


async def _send(w: RayWorker, share: Share, dispatch: Any, batch: int, offset_ns: int) -> dict[str, Any]:
    """A worker's arm, on its own loop (not a method: Ray would take the actor for an asyncio one,
    run on a loop of Ray's)."""
    w.loop = asyncio.get_running_loop()
    w.stop_event = asyncio.Event()
    w.go_at = go_at = w.loop.create_future()

    async def go() -> int:
        w.ready.set()
        return await go_at

    def keep(r: RequestRecord) -> None:
        r = replace(r, process=w.index)
        w.out.append((r.to_json(), r.ok, r.ttft_s, r.schedule_index, r.session))

    try:
        return await send_share(share, RemoteOrder(dispatch, w.index, batch, offset_ns), w.stop_event, [keep], go)
    finally:
        await dispatch.gone.remote(w.index)


def _resolve(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


@dataclass
class Member:
    """A worker of the run as the coordinator knows it."""

    index: int
    actor: Any
    info: dict[str, Any]
    lost: str | None = None  # why it is gone


@dataclass
class Cluster:
    """The run's connection to Ray and its workers (made once per run, for all its arms)."""

    address: str
    members: list[Member]
    node_ip: str  # the coordinator's
    ray_version: str
    dispatch: Any  # the Dispatch actor, beside the coordinator

    @property
    def live(self) -> list[Member]:
        return [m for m in self.members if m.lost is None]


@contextlib.contextmanager
def connect(address: str, workers: int | None, base_url: str) -> Iterator[Cluster]:
    """Join the Ray cluster at `address` ("auto": the one this host belongs to) and start
    `workers` worker actors (default: one per CPU of the cluster), spread over its nodes."""
    import ray

    try:
        ray.init(
            address=address,
            namespace=f"kvbench-{os.getpid()}-{time.time_ns()}",  # a run's actors are its own
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise EndpointError(
            f"--ray {address}: could not join a Ray cluster there ({_first_line(e)}); start one with "
            "`ray start --head` (and `ray start --address HEAD:6379` on each client host), or give its address"
        ) from None
    try:
        yield _start_members(ray, address, workers, base_url)
    finally:
        ray.shutdown()


def _start_members(ray: Any, address: str, workers: int | None, base_url: str) -> Cluster:
    cpus = int(ray.cluster_resources().get("CPU", 0))
    n = workers or cpus
    if n < 1 or n > cpus:
        raise InputError(
            f"--ray: the cluster at {address} has {cpus} CPU(s); {n} worker(s) need one each "
            "(give fewer with --workers, or add client hosts)"
        )
    actor = ray.remote(num_cpus=1, max_concurrency=ACTOR_THREADS, max_restarts=0)(RayWorker)
    actors = [actor.options(name=f"worker-{k}", scheduling_strategy="SPREAD").remote(k) for k in range(n)]
    try:
        infos = ray.get([a.info.remote() for a in actors], timeout=READY_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise EndpointError(f"--ray: {n} worker actor(s) did not start within {READY_TIMEOUT_S:g} s") from None
    except ray.exceptions.RayError as e:
        raise EndpointError(f"--ray: the workers could not start kvbench ({_first_line(e)}): {INSTALL_HINT}") from None
    mine = versions()["kvbench"]
    if odd := [i for i in infos if i["kvbench"] != mine]:
        raise InputError(
            f"--ray: kvbench {odd[0]['kvbench']} on {odd[0]['hostname']}, {mine} here: install the same version "
            "on every client host"
        )
    here = ray.util.get_node_ip_address()
    members = [Member(k, a, i) for k, (a, i) in enumerate(zip(actors, infos, strict=True))]
    away = sorted({m.info["hostname"] for m in members if m.info["node_ip"] != here})
    if _loopback(base_url) and away:
        raise InputError(
            f"--ray: the endpoint {base_url} is on this host's loopback, which workers on {', '.join(away)} cannot "
            "reach: give an endpoint every client host can reach (the emulator: `kvbench emulator --host 0.0.0.0` "
            "and --endpoint)"
        )
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # on the coordinator's node, whose loss ends the run anyway; not "soft": Ray would then
    # prefer a node with CPUs, and a worker's node that dies would take the schedule with it
    beside = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    dispatch = (
        ray.remote(num_cpus=0, max_concurrency=1)(Dispatch).options(scheduling_strategy=beside).remote([], [], [])
    )
    ray.get(dispatch.start_line.remote(), timeout=READY_TIMEOUT_S)  # up before any arm's clock starts
    return Cluster(address, members, here, ray.__version__, dispatch)


def _loopback(url: str) -> bool:
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def _first_line(e: BaseException) -> str:
    """What went wrong, in one line: a worker's own exception (Ray wraps it), or why Ray says its
    actor died."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {_first_line(cause)}"
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(e)).splitlines() if line.strip()]
    return next((line for line in lines if not line.startswith("ray::")), type(e).__name__)[:500]


async def _offset(actor: Any) -> Offset:
    trips = []
    for _ in range(CLOCK_TRIPS):
        sent = time.perf_counter_ns()
        there = await actor.now.remote()
        trips.append((sent, there, time.perf_counter_ns()))
    return Offset.estimate(trips)


@dataclass
class _Seen:
    """What the coordinator has recorded of an arm's requests."""

    indexes: set[int] = field(default_factory=set)  # schedule indexes
    turns: dict[int, int] = field(default_factory=dict)  # session -> turns recorded


class RayPool:
    """The arm of `sender` over the cluster's live workers; records go into `sink` as they come
    and are put in start order at the end. Same interface as workers.WorkerPool: `ready()`
    starts the workers' clients, `run(clock)` starts them on `clock` and returns the combined
    client health."""

    def __init__(
        self, cluster: Cluster, sender: Sender, kind: str, plan: Plan, sink: RunWriter, emulated: bool
    ) -> None:
        import ray

        self.ray, self.cluster, self.sender, self.kind, self.plan, self.sink = ray, cluster, sender, kind, plan, sink
        spec = sender.spec
        # no more workers than connections: one without any would send an open loop unbounded
        self.members = {m.index: m for m in cluster.live[: spec.connections]}
        if not self.members:
            raise EndpointError("--ray: every Ray worker of this run was lost")
        n = len(self.members)
        dealt = deal(spec.connections, n)
        self.shares = {
            k: Share(
                k, spec, kind, {}, plan, dealt[pos], sum(dealt[:pos]), emulated and m.info["node_ip"] == cluster.node_ip
            )
            for pos, (k, m) in enumerate(self.members.items())
        }
        self.times = [spec.clock.wall_s(t) for t in plan.times]
        self.dispatch = cluster.dispatch
        self.batch = 1 if kind == "sessions" else OPEN_BATCH if self.times else CLOSED_BATCH * max(1, max(dealt))
        self.offsets: dict[int, Offset] = {}
        self.runs: dict[int, Any] = {}  # worker -> its run's ObjectRef, while it runs
        self.draining: dict[int, asyncio.Future[None]] = {}  # worker -> its drain under way
        self.healths: dict[int, dict[str, Any]] = {}
        self.seen = _Seen()
        self.faults: list[dict[str, Any]] = []
        self.started = False
        self.stopping = False

    async def ready(self) -> None:
        headers = dict(self.sender.client.headers)
        await self.dispatch.reset.remote(list(self.plan.schedule), self.times, list(self.members))
        for k, m in self.members.items():
            try:
                self.offsets[k] = await _offset(m.actor)
            except self.ray.exceptions.RayError as e:
                await self._lost(k, e)
                continue
            self.runs[k] = m.actor.run.remote(
                self.shares[k], headers, self.dispatch, self.batch, self.offsets[k].offset_ns
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        for k in list(self.runs):
            while k in self.runs and not await self._call(k, "wait_ready", 0.2):
                if time.monotonic() > deadline:
                    raise EndpointError(f"--ray: worker {k} was not ready within {READY_TIMEOUT_S:g} s")
                await self._reap()

    async def run(self, clock: ModelClock) -> dict[str, Any]:
        sender = self.sender
        sender.progress.start(f"{sender.spec.arm.name} ({len(self.members)} Ray workers)", self.plan.total)
        self.started = True
        await asyncio.gather(*(self._call(k, "go", clock.t0_ns + self.offsets[k].offset_ns) for k in list(self.runs)))
        try:
            while self.runs:
                await asyncio.sleep(POLL_S)
                if sender.stop.is_set() and not self.stopping:
                    await self._stop_all()
                await self._drain_all()
                await self._reap()
        finally:
            await self._end()
        healths = [self.healths[k] for k in sorted(self.healths)]
        out = combine_health(healths, len(self.members)) if healths else {"processes": len(self.members)}
        return {**out, "engine": "ray"}

    async def _stop_all(self) -> None:
        self.stopping = True
        await asyncio.gather(*(self._call(k, "stop") for k in list(self.runs)))

    async def _call(self, k: int, method: str, *args: Any) -> Any:
        """A call on worker k; a worker found gone is dealt with (None)."""
        try:
            return await getattr(self.members[k].actor, method).remote(*args)
        except self.ray.exceptions.RayError as e:
            await self._lost(k, e)
            return None

    async def _drain_all(self) -> None:
        """Drain every running worker, waiting at most POLL_S: a worker whose node died without a
        word answers only once Ray declares it dead (seconds later), and holds up no other."""
        for k in self.runs:
            if k not in self.draining:
                self.draining[k] = asyncio.ensure_future(self._drain(k))
        if self.draining:
            await asyncio.wait(self.draining.values(), timeout=POLL_S)
        for k, task in list(self.draining.items()):
            if task.done():
                del self.draining[k]
                task.result()

    async def _drain(self, k: int) -> None:
        got = await self._call(k, "drain") or ()
        self.sink.add_lines([line for line, *_ in got])
        for _, ok, ttft, index, session in got:
            self.sender.progress.advance(ok, ttft)
            if session is not None:
                self.seen.turns[session] = self.seen.turns.get(session, 0) + 1
            elif index is not None:
                self.seen.indexes.add(index)

    async def _reap(self) -> None:
        """Workers whose run ended: their last records and what they saw."""
        if not self.runs:
            return
        done, _ = self.ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=0)
        for k, ref in list(self.runs.items()):
            if ref not in done:
                continue
            try:
                end = await ref
            except self.ray.exceptions.RayError as e:
                await self._lost(k, e)
                continue
            if (pending := self.draining.pop(k, None)) is not None:
                await pending
            await self._drain(k)  # what it kept since
            del self.runs[k]
            self.healths[k] = {**end["client_health"], "worker": k, **self._where(k)}
            for w in end["warnings"]:
                if w not in self.sender.warnings:
                    self.sender.warn(w)
            if end["aborted"] and not self.sender.aborted:
                self.sender.aborted = end["aborted"]
                self.sender.stop.set()

    async def _lost(self, k: int, e: BaseException) -> None:
        """Worker k is gone: what it took and did not report is recorded as failed."""
        m = self.members[k]
        if m.lost is not None or k in self.healths:  # already dealt with, or it had ended well
            return
        m.lost = _first_line(e)
        self.runs.pop(k, None)
        with contextlib.suppress(self.ray.exceptions.RayError):
            await self.dispatch.gone.remote(k)
        try:
            taken = await self.dispatch.taken.remote(k)
        except self.ray.exceptions.RayError:
            taken = []
        at_s = self.sender.spec.clock.since_start(time.perf_counter_ns()) if self.started else 0.0
        lost = [r for r in (self._lost_record(k, i, p, at_s) for i, p in taken) if r is not None]
        for r in lost:
            self.sink.add(r)
            self.sender.progress.advance(False, None)
        self.faults.append({"worker": k, **self._where(k), "at_s": at_s, "reason": m.lost, "lost_requests": len(lost)})
        others = any(w.lost is None for w in self.members.values())  # of this arm's workers
        self.sender.warn(
            f"Ray worker {k} on {m.info['hostname']} ({m.info['node_ip']}) was lost: {m.lost}; the {len(lost)} "
            "request(s) it had taken and not reported are recorded as failed" + (", the others go on" if others else "")
        )
        if not others and not self.sender.aborted:
            self.sender.aborted = "every Ray worker was lost"
            self.sender.stop.set()

    def _lost_record(self, k: int, i: int, p: int, at_s: float) -> RequestRecord | None:
        """The failed record of what worker k took as schedule item (i, p) and did not report:
        a request, or a session's next turn."""
        plan, spec = self.plan, self.sender.spec
        extra: dict[str, Any] = {"schedule_index": i}
        if self.kind == "sessions":
            done = self.seen.turns.get(i, 0)
            if done >= len(plan.sessions[i].prompts):
                return None
            p, extra = plan.sessions[i].prompts[done], {"session": i, "turn": done + 1}
        elif i in self.seen.indexes:
            return None
        prompt = plan.prompts[p]
        self.sender.seq += 1
        return RequestRecord(
            id=(len(self.cluster.members) + 1) * ID_STRIDE + self.sender.seq,  # unique until renumbered
            arm=spec.arm.name,
            phase="warmup" if i < plan.warmup else "run",
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
            error=f"lost with Ray worker {k} ({self.members[k].lost}): it was in flight or about to be sent",
            error_kind="lost",
            http_status=None,
            retried=False,
            process=k,
            **extra,
        )

    def _where(self, k: int) -> dict[str, Any]:
        i = self.members[k].info
        return {"node_ip": i["node_ip"], "hostname": i["hostname"]}

    async def _end(self) -> None:
        """Stopped early or done: every worker stops, and what they hold is drained (bounded)."""
        if self.runs:
            await self._stop_all()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(aio.GRACE_S + 5):
                    while self.runs:
                        await asyncio.sleep(POLL_S)
                        await self._drain_all()
                        await self._reap()
        for k in list(self.runs):  # did not stop in time: what it holds is lost with it
            with contextlib.suppress(self.ray.exceptions.RayError):
                self.ray.kill(self.members[k].actor)
            await self._lost(k, TimeoutError(f"did not stop within {aio.GRACE_S + 5:g} s"))
        if self.draining:  # of workers lost: Ray fails them once it declares them dead
            await asyncio.wait(self.draining.values(), timeout=aio.GRACE_S)
            for task in self.draining.values():
                task.cancel()
        self.sink.reorder()
        self.sink.meta["distributed"] = await self._meta()

    async def _meta(self) -> dict[str, Any]:
        """run.json's `distributed`: the workers, their clocks, and what happened to them."""
        workers = []
        for k, m in self.members.items():
            row: dict[str, Any] = {"worker": k, **self._where(k), "node_id": m.info["node_id"], "pid": m.info["pid"]}
            row["cores"] = m.info["cores"]
            row["connections"] = self.shares[k].connections
            if k in self.offsets:
                row["clock_start"] = self.offsets[k].meta()
            if m.lost is None and k in self.offsets:
                with contextlib.suppress(self.ray.exceptions.RayError):
                    end = await _offset(m.actor)
                    row["clock_end"] = end.meta()
                    row["drift_ns"] = end.offset_ns - self.offsets[k].offset_ns
            row["lost"] = m.lost
            workers.append(row)
            if (warning := _clock_warning(row)) is not None:
                self.sender.warn(warning)
        return {
            "engine": "ray",
            "address": self.cluster.address,
            "ray_version": self.cluster.ray_version,
            "coordinator_node_ip": self.cluster.node_ip,
            "nodes": sorted({m.info["node_id"] for m in self.members.values()}),
            "workers": workers,
            "faults": self.faults,
        }


def _clock_warning(row: dict[str, Any]) -> str | None:
    worst = max(row.get("clock_start", {}).get("uncertainty_ns", 0), row.get("clock_end", {}).get("uncertainty_ns", 0))
    drift = abs(row.get("drift_ns", 0))
    if worst <= CLOCK_WARN_NS and drift <= CLOCK_WARN_NS:
        return None
    return (
        f"Ray worker {row['worker']} on {row['hostname']}: its clock is known to the coordinator's only within "
        f"±{worst / 1e6:.2f} ms, and it drifted {drift / 1e6:.2f} ms over the arm; its records' times may be off by "
        "as much: put fewer workers on a loaded client host, or the coordinator nearer to them"
    )
