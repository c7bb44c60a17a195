"""`kvbench run --ray [ADDRESS]`: an arm sent by Ray actors on any number of client hosts,
coordinated as `--workers` processes are (coordinator.py); Ray places, carries and supervises.

What Ray does: it places one `RayWorker` actor per CPU asked for in a placement group spread over
the nodes (a cluster short of CPUs is said so within PLACE_TIMEOUT_S); it carries every message,
over its own connections (its ports, its TLS, its retries): the coordinator fetches a worker's
records, heartbeats and asks of the Dispatch (the arm's schedule, dispatch.py, in the coordinator
as under `--workers`) with one call after another (`RayWorker.shipped`, answered as soon as there
is something), and the answers, the start and the stop are calls on the worker (`tell`); it says
when an actor or its node dies (a call raises).

What a failed call means (every Ray call kvbench makes goes through `Retry`):
- transient, Ray's `ActorUnavailableError` (a connection reset while the call was in flight, its
  reply lost): the call is made again, RETRY_S apart and doubling to RETRY_MAX_S, for as long as
  the liveness bound (`[distributed] lost_after_s`) since its first failure. Every call so retried
  is idempotent: a fetch acknowledges the last `Shipment` (what was not acknowledged is sent again,
  so a lost reply loses no record, and an ask in it is made once), an answer told again is taken
  once (messages.Items: numbered as its ask), an arm's `run` asked again for the same arm starts
  nothing new, `Go`, `Stop` and the clock's `now` change nothing when repeated;
- anything else (`ActorDiedError`, a node gone), or transient errors past the bound: the worker is
  gone, and lost (its requests counted `lost`).

What kvbench does: each worker's actor starts a worker process exactly like a `--workers` one
(worker.process_main) and relays its pipe; the coordinator measures each worker's
monotonic clock against its own before and after each arm (round trips, clock.Offset), and the
worker puts the arm's start and an open loop's start line on its own clock by that offset, so
records and send times are on the coordinator's time line (run.json keeps the offsets with their
uncertainty and drift); a worker that sends nothing for `[distributed] lost_after_s` (a frozen
node) is declared lost, as one whose actor or node died is.

Only this module imports Ray, and only once `--ray` is given (`pip install 'kvbench[ray]'`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import os
import platform
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, cast

from harness.core import aio
from harness.core.clock import CLOCK_WARN_NS, Offset
from harness.core.errors import EndpointError, InputError, exit_at_once
from harness.distributed.coordinator import Pool
from harness.distributed.messages import (
    LAST_WORDS,
    Alive,
    Failed,
    Lost,
    Records,
    Share,
    Shipment,
    Told,
    Up,
)
from harness.distributed.worker import HEARTBEAT_S, Outbox, Outgoing, hold_after_s
from harness.results import RunWriter, versions
from harness.workloads.base import Plan, Sender

INSTALL_HINT = "pip install 'kvbench[ray]' (on this host and on every client host of the cluster)"
# Round trips per clock-offset measurement.
CLOCK_TRIPS = 16
# How long the cluster has to place the workers (s): a cluster whose CPUs are taken never does.
PLACE_TIMEOUT_S = 10.0
# After this long (s) without every placed actor answering, the run says what it waits for: Ray
# starts their processes (Python, kvbench's import), slowly on a busy host. kvbench sets no limit of
# its own: Ray bounds a worker process's start (worker_register_timeout_seconds, retried) and says
# when it gives up; Ctrl-C and SIGTERM stop the wait.
START_NOTE_S = 10.0
# How a Ray worker starts its worker process: a plain interpreter running this module (`-m`), so
# that the process imports neither Ray (multiprocessing's spawn would: it imports the actor's
# __main__, Ray's worker) nor anything else the actor has loaded; its pipe's end follows.
WORKER_ENTRY = "harness.distributed.ray_entry"
# Ray's inline limit for a call's result (max_direct_call_object_size, 100 KiB by default), raised
# for the worker actors (their runtime_env, RAY_<name> being how Ray reads a setting): a larger
# result goes through the object store and the raylets (at 2,000 req/s, about 280 KB per 0.1 s,
# that cost the raylets 8.6 % of a core against 2.5 % inline), and under the default limit every
# flush of records took two or three `shipped` calls of about a millisecond of the actor's CPU each
# (docs/performance.md: the actor 5-6 % of a core at its worker's ceiling, 3 % with this limit and
# RAY_FLUSH_S).
INLINE_BYTES = 8 << 20
# The most record bytes one `shipped` answer carries: under INLINE_BYTES with room for the rest of
# the answer, so that it comes back in the reply itself.
SHIP_BYTES = INLINE_BYTES // 2
# How often a Ray worker ships its records (s): each ship is a Ray call on its host.
RAY_FLUSH_S = 0.25
# How much of a Ray worker's pace a closed loop's batch of the schedule covers (s): each ask is a
# Ray call of its actor's, about a millisecond of its host's CPU with the answer's relay. At
# `--workers`' 0.25 s a worker at its ceiling asked 8 times a second and its actor took 3.1 % of its
# core; at 1 s, 2.5 % (docs/performance.md). A lost worker takes at most a batch and a half
# (the next is asked for when half of one is left) with it, recorded as failed (`lost`).
RAY_BATCH_S = 1.0
# Ray's settings for kvbench's actors' processes (RAY_<name>, through their runtime_env; Ray's job
# supervisor sets its own niceness the same way). Ray lowers every worker process it starts by 15
# (worker_niceness), and the worker process a worker actor starts would inherit that: beside a busy
# loop on its core it then had 3.4 % of the core against a lone process's 50 % (docs/performance.md).
# At the raylet's niceness it shares its host as a --workers process does.
NICE_ENV = {"RAY_worker_niceness": "0"}
WORKER_ENV = {**NICE_ENV, "RAY_max_direct_call_object_size": str(INLINE_BYTES)}
# How long the address --ray names has to accept a connection (s), and then to let kvbench join
# (ray.init) as a driver (s): Ray itself retries for minutes against a dead GCS.
JOIN_CHECK_S = 5.0
JOIN_TIMEOUT_S = 60.0
# A call that failed transiently is made again this long after (s), the wait doubling up to
# RETRY_MAX_S, until the liveness bound has passed since its first failure.
RETRY_S = 0.05
RETRY_MAX_S = 1.0


def require() -> None:
    """Exit 2 with the way to install Ray when it is missing."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError(f"--ray: Ray is not installed: {INSTALL_HINT}") from None


class RayWorker:
    """One worker of the run on a Ray node (made an actor by `connect`: threaded, so that `tell`,
    `now` and `shipped` are answered side by side). `run` starts the arm's worker process, the
    same program as a `--workers` process (worker.process_main, a plain interpreter: no Ray in it,
    whose threads taking Python's lock held a client loop on the actor's own thread for
    milliseconds, and cost 15-25 % more CPU per request), and a thread that relays its pipe: what
    it says (its records and its asks of the Dispatch alike) waits for the coordinator, which
    fetches it with one `shipped` call after another, and what the coordinator says goes down the
    pipe (`tell`). (Not a streaming generator: those do not work through Ray Client, `ray://`.) The
    process ends when this actor does (its pipe closes)."""

    def __init__(self, policy: Callable[[], None] | None = None) -> None:
        """`policy`: what sets this process's threads' scheduling (`batch_threads`, an actor's;
        a test that makes one in its own process passes something harmless)."""
        (policy or batch_threads)()
        self.out: Outbox[Outgoing] = Outbox()
        self.held: deque[Outgoing] = deque()  # taken from `out`, not yet fetched
        self.sent: Shipment | None = None  # fetched, not yet acknowledged
        self.seq = 0  # the last shipment's number
        self.fetching = threading.Lock()  # one fetch at a time: a retry may overlap the call it retries
        self.conn: Connection | None = None
        self.proc: subprocess.Popen[bytes] | None = None  # the arm's worker process
        self.arm: tuple[str, int] | None = None  # which arm it sends (the run's arm name, the worker)
        # the arm's worker's clock offset and liveness bound (shipped: whether a fetch is fresh);
        # not its Share, whose plan kept alive cost the actor's garbage collector 2 points of a
        # core (bench/ray_scaling.py pairs: 5.3 % against 3.3 %)
        self.bound: tuple[int, float] | None = None
        self.up = False  # it said it can send
        self.sending = threading.Lock()  # the pipe down: the relay's answers, and `tell`

    def info(self) -> dict[str, Any]:
        import ray

        return {
            "hostname": platform.node(),
            "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "cores": os.cpu_count(),
            "nice": os.getpriority(os.PRIO_PROCESS, 0),  # its worker process's too (inherited)
            "kvbench": versions()["kvbench"],
        }

    def now(self) -> int:
        return time.perf_counter_ns()

    def run(self, share: Share) -> int:
        """Start the arm's worker process (its pid); what it ships comes from `shipped`. Asked
        again for the arm it already sends (a reply lost), it starts nothing new."""
        arm = (f"{share.spec.run_id}/{share.spec.arm.name}", share.index)
        if self.arm == arm and self.proc is not None:
            return self.proc.pid
        mine, theirs = multiprocessing.Pipe(duplex=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", WORKER_ENTRY, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))},  # as this process has it
        )
        theirs.close()
        with self.fetching:
            self.out, self.conn, self.proc, self.up, self.arm = Outbox(), mine, proc, False, arm
            self.bound = (share.offset_ns, share.lost_after_s)
            self.held.clear()
            self.sent, self.seq = None, 0
        # the headers (an API key) through Ray's RPC and the pipe, never argv or disk
        self._send(share)
        relay = threading.Thread(target=self._relay, args=(mine, proc, self.out), daemon=True)
        relay.start()
        return proc.pid

    def _relay(self, conn: Connection, proc: subprocess.Popen[bytes], out: Outbox[Outgoing]) -> None:
        try:
            while True:
                said: Outgoing = conn.recv()
                self.up = self.up or isinstance(said, Up)
                out.put(said)
                if isinstance(said, LAST_WORDS):
                    break
        except (EOFError, OSError):
            out.put(Failed(f"its worker process ended without a word (exit code {proc.wait()})"))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(aio.GRACE_S)

    def _send(self, said: Told | Share) -> None:
        with self.sending, contextlib.suppress(OSError, ValueError):  # it is gone: the relay says so
            if self.conn is not None:
                self.conn.send(said)

    def shipped(self, ack: int, sent_ns: int) -> Shipment:
        """What the worker shipped since the shipment numbered `ack` (the last one the coordinator
        received; worker.Outbox's events), once there is something: at least a heartbeat every
        worker.HEARTBEAT_S while it runs; nothing after twice that (the coordinator's rule for
        silence decides). At most about SHIP_BYTES of records per shipment: the rest waits for the
        next call, which comes at once. A shipment not acknowledged (its reply lost, the call made
        again) is sent again.

        The call is the coordinator's word: its worker process is told `Alive`, unless the call
        was made (`sent_ns`, coordinator ns) longer ago than a worker holds without a word
        (worker.hold_after_s), as one queued in a frozen node's actor is once thawed: its
        worker, declared lost meanwhile, stays quiet."""
        if self.bound is not None:
            age_ns = time.perf_counter_ns() - (sent_ns + self.bound[0])
            if age_ns < hold_after_s(self.bound[1]) * 1e9:
                self._send(Alive())
        with self.fetching:
            if self.sent is not None:
                if self.sent.seq != ack:
                    return self.sent
                self.sent = None
            if not self.held:
                try:
                    self.held.append(self.out.get(timeout=2 * HEARTBEAT_S))
                except queue.Empty:
                    # while its process starts (slowly on a busy host) this actor vouches for it
                    return Shipment(ack, [Records()] if self.starting() else [])
            while not self.out.empty():
                self.held.append(self.out.get_nowait())
            self.seq += 1
            self.sent = Shipment(self.seq, ration(self.held, SHIP_BYTES))
            return self.sent

    def starting(self) -> bool:
        """The arm's worker process lives and has not said it is up."""
        return self.proc is not None and not self.up and self.proc.poll() is None

    def tell(self, said: Told) -> None:
        """What the coordinator says, down the pipe."""
        self._send(said)


def transient(e: BaseException) -> bool:
    """Whether a Ray call's error may pass if the call is made again (the module's docstring)."""
    import ray

    return isinstance(e, ray.exceptions.ActorUnavailableError)


class Retry:
    """When a failed Ray call is made again (the module's docstring): after a transient error,
    until `bound_s` has passed since the first."""

    def __init__(self, bound_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.bound_s, self.clock, self.wait = bound_s, clock, RETRY_S
        self.first: float | None = None

    def after(self, e: BaseException) -> float | None:
        """How long to wait before the next try after `e`; None: do not try again."""
        now = self.clock()
        if self.first is None:
            self.first = now
        if not transient(e) or now - self.first > self.bound_s:
            return None
        wait, self.wait = self.wait, min(2 * self.wait, RETRY_MAX_S)
        return wait


async def retried(call: Callable[[], Any], bound_s: float) -> Any:
    """`call()`'s result (a Ray ObjectRef, awaited), made again as `Retry` says."""
    retry = Retry(bound_s)
    while True:
        try:
            return await call()
        except Exception as e:
            if (wait := retry.after(e)) is None:
                raise
        await asyncio.sleep(wait)


def batch_threads() -> None:
    """This process's threads on SCHED_BATCH (where the OS has it; the threads it starts later
    inherit it): a worker actor's threads (Ray's own, whose main thread wakes about 100 times a
    second, and the relay) then do not preempt the worker process on its core each time they
    wake, but run when it waits or at the scheduler's tick, with the same fair share of the core
    as before. Measured at the worker's ceiling: the worker process preempted 0.14 times a request
    instead of 0.20, the actor 2.2 % of the core instead of 2.45 % (docs/performance.md). The
    worker process it starts goes back to the usual policy where it is started (ray_entry)."""
    if not hasattr(os, "SCHED_BATCH"):
        return
    with contextlib.suppress(OSError):  # no /proc: nothing changes
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.sched_setscheduler(int(tid), os.SCHED_BATCH, os.sched_param(0))


def ration(held: deque[Outgoing], limit: int) -> list[Outgoing]:
    """The first of `held`'s events whose records come to at most `limit` bytes, taken off it; a
    batch of records larger than that is cut after a whole line (a single line larger than
    `limit` goes alone). Never nothing, when something is held."""
    got: list[Outgoing] = []
    size = 0
    while held:
        item = held[0]
        n = len(item.lines) if isinstance(item, Records) else 0
        if size + n <= limit:
            got.append(held.popleft())
            size += n
            continue
        lines = cast(Records, item).lines
        cut = lines.rfind(b"\n", 0, limit - size) + 1
        if not cut and not got:  # its first line is larger than the limit: it goes alone
            cut = lines.find(b"\n") + 1 or n
        if cut:
            got.append(Records(lines[:cut]))
            if cut < n:
                held[0] = Records(lines[cut:])
            else:
                held.popleft()
        break
    return got


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
    lost_after_s: float

    @property
    def live(self) -> list[Member]:
        return [m for m in self.members if m.lost is None]


@contextlib.asynccontextmanager
async def joined(address: str, stop: asyncio.Event) -> AsyncIterator[bool]:
    """This process joined to the Ray cluster at `address` ("auto": the one this host belongs
    to, or RAY_ADDRESS's); False if `stop` was set first (nothing joined). An address nothing
    answers at is said within JOIN_CHECK_S; ray.init runs in a thread of its own, so that the
    run's signal handling stays in force while it connects (Ray retries for minutes against a
    dead GCS), and a cluster that has not let it join within JOIN_TIMEOUT_S is said so.
    Leaving, a signal ends the process at once (exit 130): Ray's teardown can take seconds, and
    every record is already on disk."""
    import ray

    await asyncio.to_thread(_reachable, address)
    loop = asyncio.get_running_loop()
    init: asyncio.Future[BaseException | None] = loop.create_future()
    joining = threading.Thread(target=_init, args=(address, loop, init), name="kvbench-ray-join", daemon=True)
    joining.start()
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([init, stopped], timeout=JOIN_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if not init.done():
        if stop.is_set():
            yield False  # the join thread is left behind: it ends with the process
            return
        raise EndpointError(
            f"--ray {address}: the Ray cluster there did not let kvbench join within {JOIN_TIMEOUT_S:g} s"
        )
    if (e := init.result()) is not None:
        raise EndpointError(
            f"--ray {address}: could not join a Ray cluster there ({_first_line(e)}); start one with "
            "`ray start --head` (and `ray start --address HEAD:6379` on each client host), or give its address"
        )
    try:
        yield True
    finally:
        with _signals_end_at_once():
            ray.shutdown()


@contextlib.contextmanager
def joined_now(address: str) -> Iterator[None]:
    """`joined` for a command with no event loop (`kvbench size --ray`): the same check that
    something answers, ray.init in a thread of its own (Ctrl-C and SIGTERM stay kvbench's while it
    connects) within JOIN_TIMEOUT_S, and Ray left at the end, a signal then ending the process at
    once."""
    import ray

    _reachable(address)
    got: list[BaseException | None] = []
    joining = threading.Thread(target=lambda: got.append(_connect(address)), name="kvbench-ray-join", daemon=True)
    joining.start()
    joining.join(JOIN_TIMEOUT_S)
    if not got:
        raise EndpointError(
            f"--ray {address}: the Ray cluster there did not let kvbench join within {JOIN_TIMEOUT_S:g} s"
        )
    if (e := got[0]) is not None:
        raise EndpointError(
            f"--ray {address}: could not join a Ray cluster there ({_first_line(e)}); start one with "
            "`ray start --head` (and `ray start --address HEAD:6379` on each client host), or give its address"
        )
    try:
        yield
    finally:
        with _signals_end_at_once():
            ray.shutdown()


def process_pool(processes: int) -> Any:
    """A pool of `processes` processes on the joined cluster's nodes with multiprocessing.Pool's
    interface (Ray's own, ray.util.multiprocessing: its actors, placed by Ray, which end with
    the job): what `kvbench size --workers N --ray` sizes configurations in."""
    from ray.util.multiprocessing import Pool

    return Pool(processes)


@dataclass(frozen=True)
class Stored:
    """A value in Ray's object store (ObjectStore.put): any process of the cluster loads it, its
    arrays read from the store without a copy on the node that holds them."""

    ref: Any  # ray.ObjectRef

    def load(self) -> Any:
        import ray

        return ray.get(self.ref)


class ObjectStore:
    """What a sizing sweep's processes on the cluster share (sizing/shared.py's Store), put into
    Ray's object store once: the workload by kvbench, each Placement and Baseline by the process
    that computed it."""

    def put(self, value: Any) -> Stored:
        import ray

        return Stored(ray.put(value))


def _init(address: str, loop: asyncio.AbstractEventLoop, done: asyncio.Future[BaseException | None]) -> None:
    """ray.init (in the join thread); its error, or None, to `done`."""
    got = _connect(address)
    with contextlib.suppress(RuntimeError):  # the loop is closed: the run ended meanwhile
        loop.call_soon_threadsafe(_settle, done, got)


def _connect(address: str) -> BaseException | None:
    """ray.init (in a join thread); its error, or None."""
    import ray

    quiet = logging.getLogger("ray")  # Ray's documented logger: its warning that no SIGTERM handler
    level = quiet.level  # was set outside the main thread is kvbench's intent, not news
    quiet.setLevel(logging.ERROR)
    try:
        ray.init(
            address=address,
            namespace=f"kvbench-{os.getpid()}-{time.time_ns()}",  # a run's actors are its own
            log_to_driver=False,
            logging_level=logging.WARNING,
            configure_logging=False,
        )
        return None
    except Exception as e:  # told, not raised: the command says it
        return e
    finally:
        quiet.setLevel(level)


def _settle(done: asyncio.Future[BaseException | None], value: BaseException | None) -> None:
    if not done.done():
        done.set_result(value)


def _reachable(address: str) -> None:
    """EndpointError if nothing accepts a connection at `address`'s host and port within
    JOIN_CHECK_S (Ray itself would retry for minutes); "auto" without RAY_ADDRESS is Ray's to
    find, and says at once when there is nothing."""
    if address == "auto":
        address = os.environ.get("RAY_ADDRESS", "auto")
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=JOIN_CHECK_S).close()
    except OSError as e:
        raise EndpointError(
            f"--ray {address}: nothing answers there ({e.strerror or type(e).__name__}); start a cluster with "
            "`ray start --head` (and `ray start --address HEAD:6379` on each client host), or give its address"
        ) from None


@contextlib.contextmanager
def _signals_end_at_once() -> Iterator[None]:
    """SIGINT and SIGTERM end the process at once with exit 130 while this lasts (Ray's teardown,
    which a second Ctrl-C used to break with a traceback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        signal.signal(sig, exit_at_once)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


async def start(
    address: str,
    workers: int | None,
    base_url: str,
    lost_after_s: float,
    stop: asyncio.Event,
    say: Callable[[str], None],
) -> Cluster | None:
    """`workers` worker actors (default: one per CPU of the cluster) spread over its nodes, once
    each has answered; None if `stop` is set first (what Ray started ends with ray.shutdown)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    cpus = int(ray.cluster_resources().get("CPU", 0))
    n = workers or cpus
    if n < 1 or n > cpus:
        raise InputError(
            f"--ray: the cluster at {address} has {cpus} CPU(s); {n} worker(s) need one each "
            "(give fewer with --workers, or add client hosts)"
        )
    # one CPU per worker, reserved at once and spread over the nodes; none waits for another's
    pg = placement_group([{"CPU": 1}] * n, strategy="SPREAD")
    try:
        await asyncio.wait_for(pg.ready(), PLACE_TIMEOUT_S)
    except TimeoutError:
        remove_placement_group(pg)
        free = int(ray.available_resources().get("CPU", 0))
        raise EndpointError(
            f"--ray: the cluster at {address} could not give {n} worker(s) a CPU each within {PLACE_TIMEOUT_S:g} s "
            f"({free} of its {cpus} CPU(s) free): other work holds them; give fewer with --workers"
        ) from None
    actors = [
        worker_actor(
            name=f"worker-{k}", scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k)
        ).remote()
        for k in range(n)
    ]
    try:
        infos = await _answers(actors, stop, say)
    except ray.exceptions.RayError as e:
        raise EndpointError(f"--ray: the workers could not start kvbench ({_first_line(e)}): {INSTALL_HINT}") from None
    if infos is None:
        return None
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
    return Cluster(address, members, here, ray.__version__, lost_after_s)


def worker_actor(**options: Any) -> Any:
    """RayWorker as a Ray actor class, as a run starts its workers, with Ray's `options` (its name,
    where it goes; bench/ray_scaling.py starts one to measure what it takes at rest)."""
    import ray

    # threaded: `tell` and `now` are answered while `run` streams (Ray's stubs know only the
    # options of a task, not an actor's max_concurrency)
    actor = cast(Any, ray.remote)(num_cpus=1, max_restarts=0, max_concurrency=4)(RayWorker)
    return actor.options(runtime_env={"env_vars": WORKER_ENV}, **options)


async def _answers(actors: list[Any], stop: asyncio.Event, say: Callable[[str], None]) -> list[dict[str, Any]] | None:
    """Each actor's `info`, once all have answered (Ray's error if one could not start); None if
    `stop` is set first."""
    answers: asyncio.Future[list[dict[str, Any]]] = asyncio.gather(
        *(asyncio.wrap_future(a.info.remote().future()) for a in actors)
    )
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({answers, stopped}, timeout=START_NOTE_S, return_when=asyncio.FIRST_COMPLETED)
        if not done:
            n = len(actors)
            say(f"Waiting for Ray to start {n} worker actor(s): Python and kvbench's import on each (Ctrl-C stops) ...")
            await asyncio.wait({answers, stopped}, return_when=asyncio.FIRST_COMPLETED)
        return answers.result() if answers.done() else None
    finally:
        stopped.cancel()
        answers.cancel()


class RayPool(Pool):
    """The arm over the cluster's live workers (no more than its connections: one without any
    would send an open loop unbounded)."""

    noun = "Ray workers"
    one = "Ray worker"
    engine = "ray"
    flush_s = RAY_FLUSH_S
    batch_s = RAY_BATCH_S

    def __init__(
        self, cluster: Cluster, sender: Sender, kind: str, plan: Plan, sink: RunWriter, emulated: bool
    ) -> None:
        import ray

        self.ray, self.cluster, self.emulated = ray, cluster, emulated
        self.members = {m.index: m for m in cluster.live[: sender.spec.connections]}
        if not self.members:
            raise EndpointError("--ray: every Ray worker of this run was lost")
        super().__init__(sender, kind, plan, sink, list(self.members), cluster.lost_after_s)
        self.offsets: dict[int, Offset] = {}
        self.readers: dict[int, asyncio.Task[None]] = {}
        self.launching: set[int] = set()  # its `run` call is in flight: Ray answers it, or says the actor died

    def send_clock(self, k: int) -> bool:
        return self.emulated and self.members[k].info["node_ip"] == self.cluster.node_ip

    async def start(self) -> None:
        headers = dict(self.sender.client.headers)
        for k, m in self.members.items():
            try:
                self.offsets[k] = await _offset(m.actor, self.lost_after_s)
            except self.ray.exceptions.RayError as e:
                self.events.put_nowait((k, Lost(_first_line(e))))
                continue
            self.launching.add(k)
            self.readers[k] = asyncio.ensure_future(self._read(k, headers))

    async def _read(self, k: int, headers: dict[str, str]) -> None:
        """Worker k's arm started, then what it ships as events, its end or its loss last."""
        actor, bound = self.members[k].actor, self.lost_after_s
        run = functools.partial(
            actor.run.remote,
            replace(self.shares[k], headers=headers, offset_ns=self.offsets[k].offset_ns),
        )
        try:
            try:
                await retried(run, bound)
            finally:
                self.launching.discard(k)
            self.events.put_nowait((k, Records()))  # its process started: alive
            ack = 0
            while True:
                fetch = functools.partial(actor.shipped.remote, ack, time.perf_counter_ns())
                got: Shipment = await retried(fetch, bound)
                for said in got.events:
                    self.events.put_nowait((k, said))
                    if isinstance(said, LAST_WORDS):
                        return
                ack = got.seq
        except self.ray.exceptions.RayError as e:
            self.events.put_nowait((k, Lost(_first_line(e))))

    def starting(self, k: int) -> bool:
        """Ray has not yet answered the call that starts worker k's process (slow on a busy host:
        its actor's share of a core); once it has, the actor vouches with heartbeats while the
        process starts (RayWorker.shipped)."""
        return k in self.launching

    def vouch(self) -> None:
        """Nothing to do: each fetch of a worker's records is the coordinator's word, which its
        actor relays (RayWorker.shipped)."""

    async def tell(self, k: int, said: Told) -> None:
        with contextlib.suppress(self.ray.exceptions.RayError):  # gone: its stream says so
            await retried(functools.partial(self.members[k].actor.tell.remote, said), self.lost_after_s)

    def kill(self, k: int) -> None:
        m = self.members[k]
        m.lost = m.lost or self.lost.get(k) or "not heard from"
        if (reader := self.readers.pop(k, None)) is not None:
            reader.cancel()
        with contextlib.suppress(self.ray.exceptions.RayError):
            self.ray.kill(m.actor)

    def where(self, k: int) -> dict[str, Any]:
        i = self.members[k].info
        return {"hostname": i["hostname"], "node_ip": i["node_ip"]}

    async def describe(self) -> dict[str, Any]:
        for reader in self.readers.values():  # each has said its last word, or is lost
            reader.cancel()
        workers = []
        for k, m in self.members.items():
            row: dict[str, Any] = {"worker": k, **self.where(k), "node_id": m.info["node_id"], "pid": m.info["pid"]}
            row["cores"], row["nice"] = m.info["cores"], m.info["nice"]
            row["connections"] = self.shares[k].connections
            if k in self.offsets:
                row["clock_start"] = self.offsets[k].meta()
            if k not in self.lost and k in self.offsets:
                with contextlib.suppress(self.ray.exceptions.RayError, TimeoutError):
                    async with asyncio.timeout(self.lost_after_s):
                        end = await _offset(m.actor, self.lost_after_s)
                    row["clock_end"] = end.meta()
                    row["drift_ns"] = end.offset_ns - self.offsets[k].offset_ns
            row["lost"] = self.lost.get(k)
            workers.append(row)
            if (warning := _clock_warning(row)) is not None:
                self.sender.warn(warning)
        return {
            "engine": self.engine,
            "address": self.cluster.address,
            "ray_version": self.cluster.ray_version,
            "coordinator_node_ip": self.cluster.node_ip,
            "nodes": sorted({m.info["node_id"] for m in self.members.values()}),
            "workers": workers,
        }


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


async def _offset(actor: Any, bound_s: float) -> Offset:
    trips = []
    for _ in range(CLOCK_TRIPS):
        sent = time.perf_counter_ns()
        there = await retried(actor.now.remote, bound_s)
        trips.append((sent, there, time.perf_counter_ns()))
    return Offset.estimate(trips)


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
