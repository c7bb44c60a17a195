"""`kvbench run --ray [ADDRESS]`: an arm sent by Ray actors on any number of client hosts.

The coordinator (this process, Ray's driver) settles the plan as for one process. A `Dispatch`
actor beside it holds the schedule, and each worker takes its next requests from it in batches
(`take`): whichever worker is free takes the next closed-loop request (give or take a batch; the
batches shrink as the schedule runs out), a session (one schedule item) stays with one worker,
and an open loop's requests are dealt to the workers in turn and sent by each at their time on
the coordinator's clock (a worker takes its own by time windows, well ahead). Each `RayWorker`
actor starts a client process exactly like one `--workers` process (workers.send_share, on
uvloop) and waits for it. The client talks to the Dispatch itself, over two TCP connections
(after a token; Ray stays out of the way of every request): on one it takes its batches and
hears the go, an open loop's start line and the stop; on the other it sends its finished
records every FLUSH_S, which the coordinator drains from the Dispatch every POLL_S into the
arm's one requests.jsonl.

Clocks: before and after each arm the coordinator measures each worker's monotonic clock against
its own (round trips, clock.Offset), and the worker's client puts the arm's start and an open
loop's start line on its own clock by that offset, so records and send times are on the
coordinator's time line; run.json keeps the offsets with their uncertainty and drift.

Faults: a worker whose actor or node dies is found by its failed calls; the requests it had
taken and whose records did not reach the Dispatch are recorded as failed (`error_kind =
"lost"`), the others go on with the rest of the schedule, and run.json's `distributed.faults`
says what happened. Ctrl-C stops every worker, which finish what is in flight (aio.GRACE_S) and
are drained.

Only this module imports Ray, and only once `--ray` is given (`pip install 'kvbench[ray]'`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import json
import logging
import math
import multiprocessing
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from harness.config import kinds
from harness.core import aio
from harness.core.clock import CLOCK_WARN_NS, ModelClock, Offset
from harness.core.errors import EndpointError, InputError
from harness.distributed.workers import ID_STRIDE, Share, combine_health, deal, send_share
from harness.results import RequestRecord, RunWriter, versions
from harness.workloads.base import Plan, Schedule, Sender

INSTALL_HINT = "pip install 'kvbench[ray]' (on this host and on every client host of the cluster)"
REACH = (
    "every client host must reach the Dispatch's host (the coordinator's; through ray://, the head node) on any "
    "TCP port: is there a firewall between them?"
)
# How often the coordinator drains the records the Dispatch holds into the arm's file (s): one Ray
# call on its own host (a worker that dies takes with it only what its client had not sent yet).
POLL_S = 0.5
# How often a worker's client sends its finished records to the Dispatch (s); what the Dispatch
# reads at once (bytes); how much of a client's first line it reads (bytes); and how long a drain
# waits for an ended client's last records (s): a client on a host that is gone never hangs up.
FLUSH_S = 0.05
RELAY_CHUNK = 256 * 1024
HELLO_BYTES = 256
RELAY_CLOSE_S = 2.0
# Round trips per clock-offset measurement.
CLOCK_TRIPS = 16
# A worker's client must be up within this long (s); a cluster without room for an actor never is.
READY_TIMEOUT_S = 120.0
# Requests a worker takes from the schedule at once. A closed loop's: what its client sends in
# CLOSED_BATCH_S at the pace it has kept since its last batch, at least CLOSED_BATCH times as many
# as it has connections (its first batch, and at a slow pace: a worker lost takes the batch with
# it) and at most MAX_BATCH; at most a GUIDED-th of its share of what is left (with others still
# there), so that none holds many at the end; the next batch is asked for when half of one is
# left. An open loop's: its own requests due within OPEN_WINDOW_S (wall-clock) of the first (at
# most MAX_BATCH), the next asked for when less than half a window is left: a call may take tens
# of milliseconds on a loaded host without a send waiting for it. Sized when each batch was a Ray
# call of about a millisecond of CPU, most of it on the worker's host (at 2,500 req/s, batches of
# 8x its connections took a point more of its core than batches of a quarter second, measured);
# an ask over the client's TCP connection costs far less, and the sizes still bound what a lost
# worker takes with it.
CLOSED_BATCH = 8
CLOSED_BATCH_S = 0.25
MAX_BATCH = 4096
GUIDED = 4
OPEN_WINDOW_S = 0.2
# How long after the last worker is ready for an open loop's measured part it starts (ns): time
# for every worker to hear of it before its first send is due.
START_MARGIN_NS = 50_000_000
# How often the coordinator looks whether every worker's client is up (s), and the longest line
# a client reads from the Dispatch (bytes: a batch of MAX_BATCH requests fits many times over).
UP_POLL_S = 0.05
CONTROL_BYTES = 1024 * 1024
PR_SET_PDEATHSIG = 1  # prctl(2)
# How a Ray worker starts its client: a plain interpreter, so that the client imports neither Ray
# (multiprocessing's spawn would: it imports the actor's __main__, Ray's worker) nor anything else
# the actor has loaded; the ends of its two pipes follow.
CLIENT_ENTRY = (
    "import sys; from harness.distributed.raypool import client_process; client_process(*map(int, sys.argv[1:]))"
)


def require() -> None:
    """Exit 2 with the way to install Ray when it is missing."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise InputError(f"--ray: Ray is not installed: {INSTALL_HINT}") from None


class Dispatch:
    """The schedule, shared by the workers of one arm (an asyncio Ray actor beside the
    coordinator, so one call at a time; plain Python, so that it can be tested without Ray).

    A closed loop's requests (and sessions) go to whichever worker asks next. An open loop's are
    dealt to the workers in turn, weighted by their connections, as the requests of `--workers`
    processes are, and each worker takes its own by time windows; a worker that is lost leaves its
    untaken ones to the others. It remembers what each worker took, for the requests a lost worker
    takes with it, and holds an open loop's start line: the measured part starts once every worker
    still there has its warm-up answered. It serves the workers' clients over TCP (`listen`):
    their batches, the go, the start line and the stop, and their records, which it keeps until
    the coordinator drains them."""

    def __init__(self, order: list[tuple[int, int]], times_wall_s: list[float], workers: dict[int, int]) -> None:
        self.line = _Line()
        self.token = secrets.token_hex(16)
        self.arm = 0
        self.reset(order, times_wall_s, workers)

    def reset(self, order: list[tuple[int, int]], times_wall_s: list[float], workers: dict[int, int]) -> int:
        """A new arm's schedule, and its workers with their connections (the actor serves every
        arm of the run): the arm's number, which its clients give when they connect."""
        self.line.reached.set()  # a worker still waiting at the last arm's start line: it stops waiting
        self.line = _Line()
        self.arm += 1
        self.inbox: dict[int, bytearray] = {k: bytearray() for k in workers}
        self.hung_up: dict[int, asyncio.Event] = {}  # worker -> set once its client has hung up
        self.told: dict[int, asyncio.StreamWriter] = {}  # worker -> its client's control connection
        self.up: set[int] = set()  # workers whose clients are up, waiting for the go
        self.t0_ns: int | None = None  # the arm's start, once given
        self.stopping = False
        self.telling: set[asyncio.Task[None]] = set()  # start lines under way
        self.order, self.times, self.weights = order, times_wall_s, workers
        self.next = 0
        self.given: dict[int, list[tuple[int, int]]] = {k: [] for k in workers}
        self.ready: dict[int, int] = {}  # worker -> when it was ready (coordinator ns)
        self.gone_workers: set[int] = set()
        self.own: dict[int, deque[tuple[int, int]]] = {k: deque() for k in workers}
        if times_wall_s:
            for k, items in in_turn(order, workers).items():
                self.own[k].extend(items)
        return self.arm

    def take(self, worker: int, n: int) -> list[tuple[int, int]]:
        """Up to n of this worker's next requests: of a closed loop, fewer as the schedule runs out
        if other workers are still there (guided self-scheduling); of an open loop, its own due
        within OPEN_WINDOW_S of the first."""
        if self.times:
            own, times = self.own[worker], self.times
            got: list[tuple[int, int]] = []
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
        return got

    def taken(self, worker: int) -> list[tuple[int, int]]:
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
        if self.own[worker] and left:
            for k, items in in_turn(list(self.own[worker]), left).items():
                self.own[k] = deque(heapq.merge(self.own[k], items))
            self.own[worker].clear()

    async def listen(self, host: str | None = None) -> tuple[str, int, str]:
        """Serve the workers' clients over TCP from now on (host: this Ray node's address), two
        connections each, one for its records and one for the rest: where they connect, and the
        token they must give first."""
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        # asyncio's own bound on a line (64 KiB); not HELLO_BYTES: a stream's reader pauses its
        # socket at twice its limit, and a limit that small cost this actor a fifth of a core
        server = await asyncio.start_server(self._connected, host, 0)
        self.server = server  # kept, or it would be collected and closed
        return host, server.sockets[0].getsockname()[1], self.token

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A client's connection: it says who it is first (a line: token, arm, worker, and which of
        its two connections this is), and anybody else is hung up on before a byte more is read."""
        try:
            hello = await reader.readline()
            if len(hello) > HELLO_BYTES:
                raise ValueError(hello[:HELLO_BYTES])
            token, arm, worker, kind = hello.decode("ascii").split()
            n, k = int(arm), int(worker)
        except (ValueError, OSError):  # a line past asyncio's bound is a ValueError too
            writer.close()
            return
        seen = self.hung_up if kind == "records" else self.told if kind == "control" else None
        if not secrets.compare_digest(token, self.token) or n != self.arm or k not in self.inbox or seen is None:
            writer.close()  # a stranger, a client of another arm
            return
        if k in seen:
            writer.close()  # a second one of this worker
            return
        if kind == "records":
            await self._records(k, reader, writer)
        else:
            await self._control(k, reader, writer)

    async def _records(self, k: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A client's records, as they come."""
        inbox, whole = self.inbox[k], self.hung_up.setdefault(k, asyncio.Event())
        try:
            while data := await reader.read(RELAY_CHUNK):
                inbox += data
        except OSError:  # its host is gone: what came is kept
            pass
        finally:
            whole.set()
            writer.close()

    async def _control(self, k: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A client's asks (a JSON object a line), answered on the same connection: the next
        batch of the schedule, the go, an open loop's start line, the stop. A client that hangs
        up is gone."""
        self.told[k] = writer
        if self.t0_ns is not None:
            _tell(writer, {"go": self.t0_ns})
        if self.stopping:
            _tell(writer, {"stop": 1})
        try:
            while line := await reader.readline():
                ask = json.loads(line)
                if "want" in ask:
                    _tell(writer, {"items": self.take(k, int(ask["want"]))})
                elif "up" in ask:
                    self.up.add(k)
                elif "ready_at" in ask:
                    task = asyncio.ensure_future(self._start(k, int(ask["ready_at"]), writer))
                    self.telling.add(task)
                    task.add_done_callback(self.telling.discard)
        except (ValueError, TypeError, KeyError, OSError):  # not its client after all, or its host is gone
            pass
        finally:
            if self.told.get(k) is writer:
                self.gone(k)
            writer.close()

    async def _start(self, k: int, ready_ns: int, writer: asyncio.StreamWriter) -> None:
        _tell(writer, {"start": await self.start_line(k, ready_ns)})

    def waiting(self) -> list[int]:
        """The workers whose clients are up and wait for the go."""
        return sorted(self.up)

    def go(self, t0_ns: int) -> None:
        """Every worker's client starts the arm's clock at t0_ns (coordinator ns)."""
        self.t0_ns = t0_ns
        for writer in self.told.values():
            _tell(writer, {"go": t0_ns})

    def stop(self) -> None:
        """Every worker's client finishes what is in flight and ends (one still to come, at once)."""
        self.stopping = True
        for writer in self.told.values():
            _tell(writer, {"stop": 1})

    async def drain(self, ended: tuple[int, ...] = ()) -> dict[int, bytes]:
        """The whole records that came from each worker's client since the last drain, as it
        wrote them (`relayed`); of a worker in `ended`, its last ones, once its client has hung up
        (or RELAY_CLOSE_S has passed: its host is gone), and a line it left cut short is dropped."""
        waits = [self.hung_up[k].wait() for k in ended if k in self.hung_up]
        if waits:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RELAY_CLOSE_S):
                    await asyncio.gather(*waits)
        out = {}
        for k, inbox in self.inbox.items():
            if (cut := inbox.rfind(b"\n") + 1) > 0:
                out[k] = bytes(inbox[:cut])
            del inbox[: len(inbox) if k in ended else cut]
        return out

    def _check_line(self) -> None:
        if self.ready and set(self.ready) | self.gone_workers >= set(self.given) and self.line.at is None:
            self.line.at = max(self.ready.values()) + START_MARGIN_NS
            self.line.reached.set()


@dataclass
class _Line:
    """An arm's start line, once reached (coordinator ns)."""

    reached: asyncio.Event = field(default_factory=asyncio.Event)
    at: int | None = None


def _tell(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    if not writer.is_closing():
        writer.write(json.dumps(message).encode() + b"\n")


def in_turn(items: list[tuple[int, int]], weights: dict[int, int]) -> dict[int, list[tuple[int, int]]]:
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
    out: dict[int, list[tuple[int, int]]] = {k: [] for k in weights}
    for j, item in enumerate(items):
        out[cycle[j % total]].append(item)
    return out


@dataclass(frozen=True)
class Relay:
    """Where a worker's client sends its records (the Dispatch's listener), the token it gives
    first, and the arm's number (Dispatch.reset)."""

    host: str
    port: int
    token: str
    arm: int


class FedOrder(Schedule):
    """A worker's client's side of the schedule: batches it asks the Dispatch for (the next asked
    for while half of the last one, or of an open loop's window, is left; a closed loop's sized by
    the pace the client keeps), and an open loop's start line, on this host's clock here and on
    the coordinator's (offset_ns behind) in what it tells (`tell`, a message to the Dispatch);
    `arrive` and `start_at` are called as the answers come."""

    def __init__(
        self,
        tell: Callable[[dict[str, int]], None],
        times_wall_s: list[float],
        kind: str,
        connections: int,
        offset_ns: int,
        clock: Callable[[], int] = time.perf_counter_ns,  # the pace's clock (a test's own)
    ) -> None:
        super().__init__(())
        self.tell, self.times, self.connections, self.clock = tell, times_wall_s, connections, clock
        self.limit = kinds.get(kind).batch_limit
        self.offset_ns = offset_ns
        self.buf: deque[tuple[int, int]] = deque()
        self.came = asyncio.Event()
        self.line: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.asked = self.done = False
        self.low = 0
        self.asked_ns: int | None = None  # when the last batch was asked for, and how many were handed out since
        self.handed = 0

    def arrive(self, got: list[tuple[int, int]]) -> None:
        self.asked, self.done = False, not got
        self.buf.extend(got)
        self.low = len(got) // 2
        self.came.set()

    def start_at(self, ns: int) -> None:
        """The start line has come (coordinator ns)."""
        if not self.line.done():
            self.line.set_result(ns + self.offset_ns)

    async def __anext__(self) -> tuple[int, int]:
        while not self.buf:
            if self.done:
                raise StopAsyncIteration
            self._ask()
            self.came.clear()
            await self.came.wait()
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
            self.tell({"want": self.wanted(now)})
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
        return max(least, min(MAX_BATCH, math.ceil(pace * CLOSED_BATCH_S)))

    async def measured_start(self, ready_ns: int) -> int:
        self.tell({"ready_at": ready_ns - self.offset_ns})
        return await self.line


class RayWorker:
    """One client of the arm on a Ray node (decorated as an actor by `connect`). The client is a
    process of its own, a client exactly like one of `--workers` (workers.send_share), so that
    neither Ray's threads nor Python's lock they take stall its event loop or cost it CPU. It
    talks to the Dispatch itself, over TCP: its records, and its schedule, start and stop. The
    actor only starts it and waits for it (`run`), one call at a time: a call that blocks the
    actor's main thread keeps Ray's own loop there from waking every 10 ms (a point of a core),
    and through Ray each drain's megabytes of records cost this host a point and a half more
    (both measured)."""

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

    def run(self, share: Share, headers: dict[str, str], offset_ns: int, relay: Relay) -> dict[str, Any]:
        """The arm's client, until it ends: what it saw (send_share's result)."""
        client, up, down = start_client()
        said: tuple[Any, ...] = ()
        try:
            # the headers (an API key) and the token through the pipe, never argv
            down.send((replace(share, headers=headers), relay, offset_ns))
            said = up.recv()  # its end, or why it could not start
            with contextlib.suppress(subprocess.TimeoutExpired):
                client.wait(aio.GRACE_S)
        except (OSError, EOFError):  # it ended without a word: seen below
            pass
        finally:
            if client.poll() is None:
                client.kill()
            client.wait()
            up.close()
            down.close()
        if said[:1] != ("end",):
            raise RuntimeError(
                said[1] if said else f"its client process ended without a word (exit code {client.returncode})"
            )
        return said[1]


def start_client() -> tuple[subprocess.Popen[bytes], Any, Any]:
    """A worker's client process (CLIENT_ENTRY), started from this one: the process, and the ends
    of its pipes here (what it says, and what it is told)."""
    up, child_up = multiprocessing.Pipe(duplex=False)
    child_down, down = multiprocessing.Pipe(duplex=False)
    ends = (child_up.fileno(), child_down.fileno())
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT_ENTRY, *map(str, ends)],
        pass_fds=ends,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, sys.path))},  # as this process has it
    )
    child_up.close()
    child_down.close()
    return client, up, down


def client_process(up_fd: int, down_fd: int) -> None:
    """A Ray worker's client process (CLIENT_ENTRY): its share, relay and clock offset come down
    the pipe from its actor, and its end goes up it. It ends with its actor, however that ends."""
    from multiprocessing.connection import Connection

    up, down = Connection(up_fd, readable=False), Connection(down_fd, writable=False)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the coordinator stops it
    try:
        share, relay, offset_ns = down.recv()
    except EOFError:  # its actor is gone
        return
    down.close()
    said = aio.run(_client(share, relay, offset_ns))
    with contextlib.suppress(OSError):  # its actor is gone: nobody to tell
        up.send(said)


async def _client(share: Share, relay: Relay, offset_ns: int) -> tuple[str, Any]:
    """The arm's share, sent; the Dispatch tells it what to send and when, and gets its records:
    ("end", what send_share saw), or ("failed", why)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            _, records = await asyncio.open_connection(relay.host, relay.port)
            heard, told = await asyncio.open_connection(relay.host, relay.port, limit=CONTROL_BYTES)
    except (OSError, TimeoutError) as e:
        return "failed", f"its client could not reach the Dispatch at {relay.host}:{relay.port} ({e!r}): {REACH}"
    records.write(f"{relay.token} {relay.arm} {share.index} records\n".encode())
    told.write(f"{relay.token} {relay.arm} {share.index} control\n".encode())
    stop = asyncio.Event()
    go_at: asyncio.Future[int] = loop.create_future()
    order = FedOrder(
        lambda m: _tell(told, m),
        [share.spec.clock.wall_s(t) for t in share.plan.times],
        share.kind,
        share.connections,
        offset_ns,
    )

    def stopped() -> None:
        stop.set()
        _resolve(go_at, time.perf_counter_ns())
        order.arrive([])  # nothing more comes

    async def hear() -> None:
        with contextlib.suppress(ValueError, OSError):  # a line too long, or the Dispatch gone: it stops
            while line := await heard.readline():
                said = json.loads(line)
                if "items" in said:
                    order.arrive([(i, p) for i, p in said["items"]])
                elif "go" in said:
                    _resolve(go_at, said["go"] + offset_ns)
                elif "start" in said:
                    order.start_at(said["start"])
                elif "stop" in said:
                    stopped()
        stopped()

    async def go() -> int:
        _tell(told, {"up": 1})
        return await go_at

    # Sent in bulk, FLUSH_S apart: a record is final once drained (POLL_S) anyway, and a send per
    # record costs the client more CPU.
    pending: list[bytes] = []

    def flush(again: bool = True) -> None:
        if pending:
            records.write(b"".join(pending))
            pending.clear()
        if again:
            flushing[0] = loop.call_later(FLUSH_S, flush)

    def keep(r: RequestRecord) -> None:
        pending.append(relayed(replace(r, process=share.index)))

    flushing = [loop.call_later(FLUSH_S, flush)]
    hearing = asyncio.ensure_future(hear())
    try:
        end = await send_share(share, order, stop, [keep], go)
    finally:
        flushing[0].cancel()
        flush(again=False)
        hearing.cancel()
        for writer in (records, told):  # the Dispatch has all its records once it sees the end
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return "end", end


def relayed(r: RequestRecord) -> bytes:
    """A record as a worker's client sends it: what the coordinator tracks, then the record."""
    meta = [int(r.ok), r.ttft_s, r.schedule_index, r.session]
    return b" ".join(b"-" if v is None else repr(v).encode() for v in meta) + b"\t" + r.to_json() + b"\n"


def unrelayed(line: bytes) -> tuple[bytes, bool, float | None, int | None, int | None]:
    meta, _, record = line.partition(b"\t")
    ok, ttft, index, session = (None if v == b"-" else v for v in meta.split(b" "))
    return (
        record,
        ok == b"1",
        None if ttft is None else float(ttft),
        None if index is None else int(index),
        None if session is None else int(session),
    )


def _die_with_parent() -> None:
    """Killed with the thread that started it (`run`'s, which waits for it), so with its actor
    however that ends (Linux; elsewhere it stops when its pipes close)."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # it died before that
        os._exit(1)


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
    relay: tuple[str, int, str]  # where the workers' clients reach the Dispatch, and the token they give

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
    actor = ray.remote(num_cpus=1, max_restarts=0)(RayWorker)  # one call at a time: see RayWorker
    actors = [actor.options(name=f"worker-{k}", scheduling_strategy="SPREAD").remote() for k in range(n)]
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
    dispatch = ray.remote(num_cpus=0)(Dispatch).options(scheduling_strategy=beside).remote([], [], {})
    relay = ray.get(dispatch.listen.remote(), timeout=READY_TIMEOUT_S)  # up before any arm's clock starts
    return Cluster(address, members, here, ray.__version__, dispatch, relay)


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
        self.offsets: dict[int, Offset] = {}
        self.runs: dict[int, Any] = {}  # worker -> its run's ObjectRef, while it runs
        self.healths: dict[int, dict[str, Any]] = {}
        self.seen = _Seen()
        self.faults: list[dict[str, Any]] = []
        self.started = False
        self.stopping = False

    async def ready(self) -> None:
        headers = dict(self.sender.client.headers)
        weights = {k: share.connections for k, share in self.shares.items()}
        arm = await self.dispatch.reset.remote(list(self.plan.schedule), self.times, weights)
        relay = Relay(*self.cluster.relay, arm)
        for k, m in self.members.items():
            try:
                self.offsets[k] = await _offset(m.actor)
            except self.ray.exceptions.RayError as e:
                await self._lost(k, e)
                continue
            self.runs[k] = m.actor.run.remote(self.shares[k], headers, self.offsets[k].offset_ns, relay)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.runs and (late := set(self.runs) - set(await self._dispatch("waiting") or self.runs)):
            if time.monotonic() > deadline:
                names = ", ".join(map(str, sorted(late)))
                raise EndpointError(f"--ray: worker(s) {names} were not ready within {READY_TIMEOUT_S:g} s")
            await asyncio.sleep(UP_POLL_S)
            await self._reap()

    async def run(self, clock: ModelClock) -> dict[str, Any]:
        sender = self.sender
        sender.progress.start(f"{sender.spec.arm.name} ({len(self.members)} Ray workers)", self.plan.total)
        self.started = True
        await self._dispatch("go", clock.t0_ns)
        try:
            while self.runs:
                await asyncio.sleep(POLL_S)
                if sender.stop.is_set() and not self.stopping:
                    await self._stop_all()
                await self._drain()
                await self._reap()
        finally:
            await self._end()
        healths = [self.healths[k] for k in sorted(self.healths)]
        out = combine_health(healths, len(self.members)) if healths else {"processes": len(self.members)}
        return {**out, "engine": "ray"}

    async def _stop_all(self) -> None:
        self.stopping = True
        await self._dispatch("stop")

    async def _dispatch(self, method: str, *args: Any) -> Any:
        """A call on the Dispatch; if it is gone (with the coordinator's node, or the head node
        through ray://), the run cannot go on: it ends, and what came is kept."""
        try:
            return await getattr(self.dispatch, method).remote(*args)
        except self.ray.exceptions.RayError as e:
            if not self.sender.aborted:
                self.sender.aborted = f"the Dispatch actor beside the coordinator was lost ({_first_line(e)})"
                self.sender.stop.set()
            return None

    async def _drain(self, ended: tuple[int, ...] = ()) -> None:
        """The records the workers' clients sent the Dispatch since the last drain (of those
        `ended`, all of them): into the file, and what the coordinator tracks."""
        for data in (await self._dispatch("drain", ended) or {}).values():
            got = [unrelayed(line) for line in data.splitlines()]
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
            await self._drain((k,))  # its last ones
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
        await self._drain((k,))  # what it sent before is kept
        await self._dispatch("gone", k)
        taken = await self._dispatch("taken", k) or []
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
        untaken = kinds.get(self.kind).untaken(plan, i, p, self.seen)
        if untaken is None:
            return None
        p, extra = untaken
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
                        await self._drain()
                        await self._reap()
        for k in list(self.runs):  # did not stop in time: what it holds is lost with it
            with contextlib.suppress(self.ray.exceptions.RayError):
                self.ray.kill(self.members[k].actor)
            await self._lost(k, TimeoutError(f"did not stop within {aio.GRACE_S + 5:g} s"))
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
