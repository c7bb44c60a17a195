"""The streaming transport behind `StreamingClient`: kvbench's own (`Kvbench`: connection.py's
pool, a request written in one piece, its response read where the backlog releases each stamped
read, one task wake-up per request), for http and https alike. via_aiohttp.py has the same
interface on aiohttp's public client API, as an escape hatch (`[endpoint] transport`).

A transport fills in an `Exchange` and raises what went wrong: connection.TransportError (its
`kind` is the record's error kind) or TimeoutError (the first token's or the total deadline);
client.py turns both into the record's error.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Protocol

from harness.wire import http1
from harness.wire.connection import (
    UNREADABLE,
    BrokenFraming,
    Connection,
    CutShort,
    Disconnected,
    Habit,
    IdleTimeout,
    Origin,
    Pool,
    TransportError,
    unreadable,
)
from harness.wire.request import Target
from harness.wire.response import Response, TooManyTokens
from harness.wire.sse import SSELimitError
from harness.wire.stamps import Stamp
from harness.wire.stream import FramePatterns
from harness.wire.turns import Turns

if TYPE_CHECKING:
    from harness.wire.client import Exchange

# client_health.stamping: where the time of a response byte is taken
SOCKET_READ = "socket-read"  # the kernel's receive stamp of the read, else the time of the read
PARSE_TIME = "parse-time"


class TooLong(TransportError):
    """The response went on past what it may carry."""

    kind = "too_long"


class Backend(Protocol):
    """What StreamingClient needs of a transport."""

    name: str  # client_health.transport
    stamping: str  # client_health.stamping

    @property
    def connections(self) -> str: ...

    async def exchange(self, url: str, body: bytes, request_id: str, ex: Exchange, first_token_by: int | None) -> None:
        """Send one request and read its response into `ex` (`first_token_by`: perf_counter_ns
        by which the first token is due, None: only the total deadline, the caller's)."""

    async def open_idle(self, url: str, n: int) -> int: ...

    async def close(self) -> None: ...


class Reader:
    """Reads one response on its connection (`conn.reader`): fed each stamped read as the backlog
    releases it, and at the connection's end. `finished` resolves when the exchange is over (the
    stream's end, [DONE], an error, a timeout); `failure` then says why it failed, if it did."""

    __slots__ = (
        "conn",
        "ex",
        "failure",
        "finished",
        "first_token_by",
        "head_ns",
        "idle_ns",
        "loop",
        "response",
        "timer",
    )

    def __init__(
        self,
        ex: Exchange,
        conn: Connection,
        response: Response,
        timeouts: tuple[float, float],
        first_token_by: int | None,
    ):
        self.ex, self.conn, self.response = ex, conn, response
        self.loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.failure: TransportError | None = None
        # (idle_s, connect_s): no data for idle_s fails the exchange; so does a head (status line
        # and headers) not whole within connect_s of its first byte: an engine writes its head at
        # once, and a head that trickles would otherwise hold the request for first_token_s
        self.idle_ns, self.head_ns = int(timeouts[0] * 1e9), int(timeouts[1] * 1e9)
        self.first_token_by = first_token_by
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The request is written: the timer (no data for idle_s, no first token in time) runs,
        and the connection is watched until its first token."""
        self.conn.await_first_token(True)
        self._check()

    def feed(self, stamp: Stamp, data: bytes) -> None:
        response, ex = self.response, self.ex
        ex.last_read_ns = stamp.t_ns
        before = ex.state.first_token_ns
        try:
            response.feed(stamp.t_ns, data)
        except http1.ProtocolError as e:
            self._end(BrokenFraming(f"protocol: broken HTTP framing: {e}"))
            return
        except SSELimitError as e:
            self._end(BrokenFraming(f"protocol: {e}"))
            return
        except TooManyTokens as e:
            self._end(TooLong(f"too long: {e}"))
            return
        except UNREADABLE as e:
            self._end(BrokenFraming(unreadable(e)))
            return
        if ex.http_status is None and response.head_from == stamp.t_ns:  # a head begun, not whole
            self.stop()
            self._check()  # its bound, from now
        if before is None and ex.state.first_token_ns is not None:
            self.conn.await_first_token(False)
            ex.first_token_read(stamp, self._later(response) or int(stamp.held_more))
        # After [DONE], the body's end is read on from the reads already in, so that the
        # connection can be reused; if it is not there yet, the connection is closed.
        if not self.finished.done() and response.ended() and (response.parser.done or not self.conn.held):
            self._end(None)

    @staticmethod
    def _later(response: Response) -> int:
        """Events of the response after its first token in the read that carried it: the token
        chunks after it, or one for a later event that is not a token or came only in part."""
        state = response.ex.state
        tokens = len(state.token_chunk_ns) - 1
        ended = state.done or state.finish_reason is not None or response.parser.done
        return tokens or int(ended or not response.decoder.between_events())

    def eof(self) -> None:
        """The server ended the connection (its held reads were fed first)."""
        if self.finished.done():
            return
        try:
            self.response.parser.eof()
        except http1.ProtocolError as e:
            self._lost(str(e))
            return
        self.feed(Stamp(self.conn.last_read_ns), b"")  # a body that ran to the connection's end is complete

    def lost(self, exc: BaseException | None) -> None:
        if not self.finished.done():
            self._lost(f"connection lost: {exc}" if exc else "the server closed the connection")

    def _lost(self, why: str) -> None:
        if self.ex.http_status is None:  # no answer at all
            self._end(Disconnected(f"no answer: {why}"))
        else:
            self._end(CutShort(f"response cut short: {why}"))

    def _check(self) -> None:
        """Fail the exchange once its server has been quiet for idle_s, or its first token is
        late; else look again when either could next be true. One timer, moved only when it
        fires: nothing is done for it per read."""
        now = time.perf_counter_ns()
        left = self.idle_ns - (now - max(self.conn.last_read_ns, self.ex.start_ns))
        if left <= 0:
            self._end(IdleTimeout(f"timeout: no data for {self.idle_ns / 1e9:g} s (idle_s)"))
            return
        head_from = self.response.head_from
        if head_from is not None and self.ex.http_status is None:
            head_left = self.head_ns - (now - head_from)
            if head_left <= 0:
                why = f"timeout: the response's head was not whole {self.head_ns / 1e9:g} s after its first byte"
                self._end(IdleTimeout(f"{why} (connect_s)"))
                return
            left = min(left, head_left)
        if self.first_token_by is not None and self.ex.state.first_token_ns is None:
            if now >= self.first_token_by:
                self._end(None, TimeoutError())
                return
            left = min(left, self.first_token_by - now)
        self.timer = self.loop.call_later(left / 1e9, self._check)

    def _end(self, failure: TransportError | None, timeout: TimeoutError | None = None) -> None:
        if not self.finished.done():
            self.failure = failure
            self.response.over = True
            if timeout is not None:
                self.finished.set_exception(timeout)
            else:
                self.finished.set_result(None)
        self.stop()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class Kvbench:
    """kvbench's own transport: see connection.py."""

    name = "kvbench"
    stamping = SOCKET_READ

    def __init__(
        self, limit: int, connect_s: float, idle_s: float, max_line_bytes: int, send_clock: bool, turns: Turns
    ) -> None:
        self.pool = Pool(limit, connect_s, turns)
        self.idle_s, self.max_line_bytes = idle_s, max_line_bytes
        self.send_clock = send_clock
        self.frames = FramePatterns()  # the fast path's patterns, shared by this client's responses
        self.headers: dict[str, str] = {}
        self._targets: dict[str, Target] = {}

    @property
    def connections(self) -> str:
        return self.pool.habit.connections

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = Target.of(url, self.headers)
        return target

    async def exchange(self, url: str, body: bytes, request_id: str, ex: Exchange, first_token_by: int | None) -> None:
        target = self._target(url)
        conn = await self.pool.acquire(target.origin)
        ex.reused = conn.served > 0
        response = Response(ex, self.max_line_bytes, self.frames)
        reader = Reader(ex, conn, response, (self.idle_s, self.pool.connect_s), first_token_by)
        reusable = False
        try:
            if first_token_by is not None and time.perf_counter_ns() >= first_token_by:
                raise TimeoutError  # waited for a connection past the first token's time: not sent
            conn.reader = reader
            closing = self.pool.habit.closes_after_response
            data = target.encode(body, request_id, closing, ex.start_ns if self.send_clock else None)
            ex.start_ns, ex.written = time.perf_counter_ns(), True
            self.pool.turns.written()
            conn.write(data)
            reader.start()
            await reader.finished
            if isinstance(reader.failure, Disconnected) and ex.reused:
                # the server closed a kept-alive connection after a request went out on it, with no
                # answer: from now on one connection per request, as for a server that closes each
                self.pool.habit.state = Habit.CLOSES
            if reader.failure is not None:
                raise reader.failure
            reusable = response.reusable()
        finally:
            reader.stop()
            response.parser.close()
            self.pool.release(conn, reusable)
        if response.error_body is not None:
            ex.error, ex.error_kind = f"HTTP {ex.http_status}: {response.error_text()}", "http"

    async def open_idle(self, url: str, n: int) -> int:
        return await self.pool.open_idle(Origin.of(url), n) if n > 0 else 0

    async def close(self) -> None:
        await self.pool.close()
