"""Turns at parsing, so that the event loop polls the sockets at least every SLICE_NS, and a
watch over the connections that await their first token, asked between the loop's reads and
between the reads it parses, and read at once (`FirstTokenWatch`).

A response's bytes are stamped when the loop reads them (see connection.py), so a stamp is late
by however long the loop went without polling. A stream that parses a 256-token burst in
one go holds the loop for ~2 ms; streams that each yield after a slice of their own do not help
enough, since every ready stream takes its slice before the next poll (28 streams x 0.5 ms =
14 ms). So all streams share one budget per turn: a stream that finds it spent queues, and each
loop turn wakes only the stream at the head of the queue (first come, first served; a woken
stream that still has work queues again at the back). What follows a response's record (a closed
loop's next request) takes a turn too (workloads/base.py).

A timed send (an open loop's) holds parsing back from SEND_MARGIN_NS before its time until it
is written (`expect`, `written`), so that the loop turns it falls due and is written in are
short: it waits behind no slice of parsing. A send that cannot be written (a connection that
will not open) holds parsing back for at most SEND_HOLD_NS.

Each `StreamingClient` owns one `Turns` and hands it to its transport, its connections and its
senders: every stream of a client's loop shares that budget.
"""

from __future__ import annotations

import asyncio
import bisect
import select
import time
from collections import deque
from contextvars import ContextVar
from typing import Protocol

SLICE_NS = 200_000  # parsing allowed between two polls of the sockets
SEND_MARGIN_NS = 100_000  # parsing stops this long before a timed send falls due ...
SEND_HOLD_NS = 2_000_000  # ... and until it is written, or at most this long after its time
# How often, at most, a busy loop looks for first tokens between its reads and its parsing: each
# look is a system call, and what they cost the client's ceiling is in docs/performance.md
WATCH_NS = 100_000

# The time a timed send is due at, in the task that sends it (and the one aiohttp writes it from).
DUE: ContextVar[int | None] = ContextVar("kvbench_due", default=None)


class Watched(Protocol):
    """A connection the watch can read (connection.Connection)."""

    paused: bool

    def read(self) -> int: ...


class FirstTokenWatch:
    """The connections whose exchange awaits its first token, in an epoll of their own
    (edge-triggered: each arrival is reported once) that the client asks between the loop's reads
    and between the reads it parses, every WATCH_NS at most; what it reports is read at once.

    The loop reads every ready socket once a turn. With 256 streams and tokens 1 ms apart, a turn
    of reads outlasts the gap, so a first token read in its turn had often been merged with the
    next one by the kernel and took that one's stamp, a gap late (Linux has no per-segment stamp
    once segments merge). Where there is no epoll (not Linux: no kernel stamps either), nothing
    is watched."""

    __slots__ = ("checked_ns", "conns", "epoll")

    def __init__(self) -> None:
        self.epoll: select.epoll | None = None  # made at the first connection watched
        self.conns: dict[int, Watched] = {}
        self.checked_ns = 0

    def add(self, fd: int, conn: Watched) -> None:
        if fd in self.conns or not hasattr(select, "epoll"):
            return
        if self.epoll is None:
            self.epoll = select.epoll()
        self.epoll.register(fd, select.EPOLLIN | select.EPOLLET)
        self.conns[fd] = conn

    def discard(self, fd: int, conn: Watched) -> None:
        if self.conns.get(fd) is conn and self.epoll is not None:
            del self.conns[fd]
            self.epoll.unregister(fd)

    def check(self, now_ns: int) -> None:
        """Read the watched connections that data reached since the last look, if that was
        WATCH_NS ago."""
        if not self.conns or now_ns - self.checked_ns < WATCH_NS or self.epoll is None:
            return
        self.checked_ns = now_ns
        for fd, _ in self.epoll.poll(0, len(self.conns)):
            conn = self.conns.get(fd)
            if conn is not None and not conn.paused:
                conn.read()

    def close(self) -> None:
        self.conns.clear()
        if self.epoll is not None:
            self.epoll.close()
            self.epoll = None


class Turns:
    __slots__ = ("_loop", "_scheduled", "_sends", "_waiting", "start_ns", "watch")

    def __init__(self) -> None:
        self.watch = FirstTokenWatch()
        self.start_ns = 0  # when the current turn began
        self._sends: list[int] = []  # due times of the timed sends not yet on their way, ascending
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None

    def polled(self, now_ns: int) -> None:
        """The loop has just polled the sockets (and delivered bytes): a new turn begins."""
        self.start_ns = now_ns

    def spent(self) -> bool:
        now = time.perf_counter_ns()
        return now - self.start_ns > SLICE_NS or self.send_near(now)

    def send_near(self, now_ns: int) -> bool:
        """Is a timed send due within SEND_MARGIN_NS, or overdue and not yet written?"""
        sends = self._sends
        while sends and now_ns - sends[0] > SEND_HOLD_NS:
            del sends[0]
        return bool(sends) and now_ns >= sends[0] - SEND_MARGIN_NS

    def expect(self, due_ns: int) -> None:
        """This task will send at `due_ns` (DUE): parsing yields to it from SEND_MARGIN_NS before."""
        DUE.set(due_ns)
        bisect.insort(self._sends, due_ns)

    def written(self) -> None:
        """The request of this task's timed send (if any) is being written: parsing goes on.
        Also called when it is dropped or fails first; once is enough."""
        due = DUE.get()
        if due is not None:
            DUE.set(None)
            if due in self._sends:
                self._sends.remove(due)

    async def wait(self) -> None:
        """Give the loop back until this stream's turn comes; the turn's budget starts then."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests run several): nothing carries over
            self._loop, self._scheduled = loop, False
            self._waiting.clear()
        fut = loop.create_future()
        self._waiting.append(fut)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._next)
        await fut
        self.start_ns = time.perf_counter_ns()

    def _next(self) -> None:
        # Runs once per loop turn while streams wait; the woken stream runs in the next turn,
        # after the loop has polled the sockets.
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():  # a cancelled waiter (its request timed out) is skipped
                fut.set_result(None)
                break
        self._scheduled = bool(self._waiting)
        if self._scheduled:
            assert self._loop is not None
            self._loop.call_soon(self._next)
