"""When each response byte arrived: stamped as the loop reads the socket, before any parsing.

The event loop reads every ready socket in one go and hands each read to its protocol at once.
aiohttp's protocol parses HTTP there and then: about 0.6 ms for a 40 KB burst of 256 small
chunked SSE events. With 16 streams ready together, the last one's bytes would be stamped 9 ms
after they arrived, behind the others' parsing. So `StampedHandler` only stamps and holds each
read; the reads are handed to aiohttp's parser afterwards, in arrival order, a slice of time at
a time (turns.SLICE_NS), so the loop gets back to the sockets in between.

Each response's stamps are kept as (time, payload bytes) pairs in the order the payload got
them, for client.py to pair with what it reads. The HTTP chunks one read adds to a response body
(an SSE event each, from most engines) are merged into one piece of it (`merge_chunks`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import select
import socket
import time
from collections import deque
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import HttpProcessingError

from harness.wire import seam
from harness.wire.turns import SLICE_NS, TURNS

# The exchange whose request is being sent, so that the connection's protocol can say whether the
# server had closed that (kept-alive) connection before the request was written.
SENDING: ContextVar[Any] = ContextVar("kvbench_sending", default=None)
RELEASE_BYTES = 8192  # ~50 SSE events: about 0.1 ms of aiohttp's parsing
# Bytes one connection may hold before it is parsed: beyond this, reading pauses until the parser
# has caught up to half of it, so a server that sends faster than it can be parsed (a flood) holds
# at most this much per connection.
HOLD_BYTES = 1 << 20
# A server that closes a connection this soon after a complete response, having answered nothing
# since, closes every connection after its response (the pinned llama.cpp does so after each
# streamed response, without sending `Connection: close`): a request written in between was
# never read.
CLOSE_AFTER_RESPONSE_NS = 50_000_000
# What poll says of a connection the server has closed or reset (Linux); elsewhere a peek tells
_HANGUP = (select.POLLRDHUP | select.POLLHUP | select.POLLERR) if hasattr(select, "POLLRDHUP") else 0


class Habit:
    """What a client has learned about the server's connections, shared by its handlers."""

    def __init__(self) -> None:
        self.closes_after_response = False


class FramingError(aiohttp.ClientPayloadError):
    """The response's HTTP framing broke (e.g. a bad chunk size) after its headers."""


class Backlog:
    """Reads held by a session's handlers, in the order they came; released a slice per loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.handlers: deque[StampedHandler] = deque()
        self.scheduled = False

    def add(self, handler: StampedHandler) -> None:
        self.handlers.append(handler)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        start = now = time.perf_counter_ns()
        try:
            while self.handlers and now - start < SLICE_NS and not TURNS.send_near(now):
                handler = self.handlers[0]
                if handler.held:
                    handler.release_one()
                if not handler.held:  # also when eof or a lost connection released it meanwhile
                    self.handlers.popleft()
                now = time.perf_counter_ns()
        finally:  # a read that broke aiohttp's parser must not stop the others
            self.scheduled = bool(self.handlers)
            if self.scheduled:
                self.loop.call_soon(self._drain)


class StampedHandler(ResponseHandler):
    """aiohttp's response protocol, with each read stamped on arrival and parsed later."""

    def __init__(self, loop: asyncio.AbstractEventLoop, backlog: Backlog, habit: Habit, merge: bool) -> None:
        super().__init__(loop)
        self.backlog, self.habit, self.merge = backlog, habit, merge
        self.held: deque[tuple[int, bytes]] = deque()
        self.held_bytes = 0
        self.served = 0  # requests started on this connection
        self.peer_closed = False  # the server's EOF (or reset) has been seen
        self.held_pause = False  # reading paused here (aiohttp pauses for reasons of its own)
        self._stamped: aiohttp.StreamReader | None = None  # the payload `arrivals` belong to
        self.arrivals: list[tuple[int, int]] = []
        self._last_ns = 0  # stamp of the read released last
        self.current: Any = None  # the exchange of the request last written here
        self.answered = False  # ... and whether any byte has come back since
        self.done_ns: int | None = None  # arrival of the end of its response, None until then
        self.previous_done_ns: int | None = None  # the end of the response before it
        self.last_read_ns = 0  # when the last read arrived
        self.reader: Any = None  # direct.Reader: reads the response itself, aiohttp's parser idle
        self._hangup: Any = None  # select.poll for the server's close (_closed_by_peer)

    def data_received(self, data: bytes) -> None:
        if not data:
            # aiohttp resuming its paused parser: the bytes it kept back came in the last read
            # released (or before), and before any read still held here.
            self._feed(self._last_ns, data)
            return
        now = time.perf_counter_ns()
        TURNS.polled(now)
        self.last_read_ns = now
        self.answered = True
        self.held.append((now, data))
        self.held_bytes += len(data)
        if len(self.held) == 1:
            self.backlog.add(self)
        if self.held_bytes > HOLD_BYTES and self.transport is not None and not self.transport.is_closing():
            # again after aiohttp resumed reading for its own reasons: pausing twice is harmless
            self.held_pause = True
            self.transport.pause_reading()

    def resume_reading(self, resume_parser: bool = True) -> None:
        # aiohttp calls this for every HTTP chunk it hands to a reader (one per SSE event here),
        # paused or not; unpaused, it would only feed the parser nothing: a dozen calls an event.
        if self._reading_paused:
            super().resume_reading(resume_parser)

    def set_exception(self, exc: BaseException, *args: Any) -> None:
        """aiohttp closes a connection whose HTTP framing breaks mid-body (a bad chunk size) but
        leaves the response body waiting, with its read timeout dropped: the request would wait
        for its total timeout. Fail the body at once."""
        super().set_exception(exc, *args)
        payload = self._payload
        broken = isinstance(exc, HttpProcessingError)  # not a read timeout: aiohttp passes those on
        if broken and payload is not None and payload.exception() is None and not payload.is_eof():
            payload.set_exception(FramingError(f"broken HTTP framing: {exc}"))

    def set_response_params(self, **params: Any) -> None:
        """aiohttp calls this on the connection it chose, just before it writes the request: the
        moment to prove (or not) that a kept-alive connection was closed by the server already."""
        super().set_response_params(**params)
        self.begin(SENDING.get())

    def begin(self, ex: Any) -> None:
        """A request (its exchange `ex`, None for other calls) is about to be written here."""
        if ex is not None:
            ex.reused = self.served > 0
            ex.closed_before_send = ex.reused and self._closed_by_peer()
        self.served += 1
        if self.habit.closes_after_response:
            self.force_close()  # not back to the pool after this response: the server ends it
        self.current, self.answered = ex, False
        self.previous_done_ns, self.done_ns = self.done_ns, None

    def _closed_by_peer(self) -> bool:
        """Has the server closed this connection? Its EOF may wait in the socket unread: ask
        the kernel (poll for a hang-up, where there is POLLRDHUP), else peek."""
        if self.peer_closed or self.transport is None or self.transport.is_closing():
            return True
        if self._hangup is not None:
            return bool(self._hangup.poll(0))
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return False
        if _HANGUP:  # one poll object for the connection's life (it owns no descriptor)
            self._hangup = select.poll()
            self._hangup.register(sock.fileno(), _HANGUP)
            return bool(self._hangup.poll(0))
        # a socket object on the same descriptor (not a duplicate: no system calls but the peek)
        peek = socket.socket(sock.family, sock.type, fileno=sock.fileno())
        try:
            return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # open, nothing pending
        except OSError:
            return True  # reset by the server
        finally:
            peek.detach()

    def eof_received(self) -> None:
        self.release_all()
        self._closed_by_server()
        if self.reader is not None:
            self.reader.eof()
        super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.release_all()
        if exc is not None:  # a reset; without one, the client closed it (or the server did, seen above)
            self._closed_by_server()
        self.peer_closed = True
        if self.reader is not None:
            self.reader.lost(exc)
        super().connection_lost(exc)

    def _closed_by_server(self) -> None:
        """The server ended this connection (or it was lost). Soon after a complete response,
        with nothing answered since, it is a server that closes every connection after its
        response: the request written meanwhile (if any) was never read, and from now on the
        client asks for one connection per request."""
        if self.peer_closed:
            return
        self.peer_closed = True
        idle = self.done_ns is not None
        last = self.done_ns if idle else None if self.answered else self.previous_done_ns
        if last is None or time.perf_counter_ns() - last >= CLOSE_AFTER_RESPONSE_NS:
            return
        self.habit.closes_after_response = True
        if not idle and self.current is not None:
            self.current.closed_after_response = True

    def release_all(self) -> None:
        while self.held:
            self.release_one()

    def release_one(self) -> None:
        """Hand aiohttp the oldest held read, or its first RELEASE_BYTES: a loaded client reads
        up to 256 KB at once, which aiohttp would parse for 4 ms without a break."""
        t, data = self.held[0]
        if len(data) > RELEASE_BYTES:
            self.held[0] = (t, data[RELEASE_BYTES:])
            data = data[:RELEASE_BYTES]
        else:
            self.held.popleft()
        self.held_bytes -= len(data)
        if self.held_pause and self.held_bytes <= HOLD_BYTES // 2:
            self.held_pause = False
            if not self._reading_paused and self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
        self._last_ns = t
        self._feed(t, data)

    def _feed(self, t: int, data: bytes) -> None:
        """Hand bytes to aiohttp's parser (or the direct reader); note how many reached the
        response body, and when."""
        if self.reader is not None:
            self.reader.feed(t, data)
            return
        before = self._payload
        had = before.total_bytes if before is not None else 0
        pieces = len(before._buffer) if self.merge and type(before) is aiohttp.StreamReader else 0
        super().data_received(data)
        payload = self._payload
        if payload is None:
            return
        if payload is not self._stamped:  # a new response began in this read
            self._stamped, self.arrivals = payload, []
        if payload is not before:
            had = pieces = 0
        if payload.total_bytes > had:
            self.arrivals.append((t, payload.total_bytes - had))
            if self.merge and type(payload) is aiohttp.StreamReader:
                merge_chunks(payload, pieces)
        if self.done_ns is None and payload.is_eof():
            self.done_ns = t

    def arrivals_of(self, payload: aiohttp.StreamReader) -> list[tuple[int, int]]:
        """The stamps of this response's bytes not yet read (`take` consumes them)."""
        if payload is not self._stamped:
            self._stamped, self.arrivals = payload, []
        return self.arrivals


def merge_chunks(payload: aiohttp.StreamReader, pieces: int) -> None:
    """Join what one read added to a body's buffer (after its first `pieces`) into one piece.
    aiohttp keeps every HTTP chunk as a piece of its own and its reader takes them one at a time
    (with one SSE event per chunk, about a tenth of the client's CPU at its ceiling). The chunk
    boundaries it also keeps (for `iter_chunks`, which kvbench does not use) are dropped."""
    buf = payload._buffer
    if len(buf) - pieces > 1:  # (the reader's offset into the first piece stays right: that piece
        # is either kept as it is or was added by this read to an empty buffer, which has none)
        kept = list(itertools.islice(buf, pieces))
        joined = b"".join(itertools.islice(buf, pieces, None))
        buf.clear()
        buf.extend(kept)
        buf.append(joined)
    splits = payload._http_chunk_splits
    if splits:
        splits.clear()


def take(arrivals: list[tuple[int, int]], size: int, now_ns: int) -> list[tuple[int, int]]:
    """Split `size` bytes just read into the pieces that arrived together: [(time, bytes)].
    Takes the oldest stamps from `arrivals` (splitting one if the read ends inside it) and
    leaves the rest there for the next read. Bytes without a stamp (a connection that is not a
    StampedHandler's) count as arriving `now_ns`."""
    pieces = []
    while size > 0 and arrivals:
        t, n = arrivals[0]
        if n > size:
            arrivals[0] = (t, n - size)
            n = size
        else:
            del arrivals[0]
        pieces.append((t, n))
        size -= n
    if size > 0:
        pieces.append((now_ns, size))
    return pieces


# An idle pooled connection is closed after this long, before the servers kvbench meets close it
# themselves (llama.cpp's and uvicorn's, vLLM's, keep-alive is 5 s): a request written just as the
# server closes its end would fail with no proof it was never read (and so is not sent again).
KEEPALIVE_S = 4.0


def connector(limit: int, habit: Habit) -> tuple[aiohttp.TCPConnector, tuple[str, ...]]:
    """A connector whose connections use StampedHandler, and the aiohttp internals missing for
    that (none: stamped at socket reads; else a plain connector, stamped at parse time)."""
    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=0, ttl_dns_cache=None, keepalive_timeout=KEEPALIVE_S)
    gone = seam.missing_handler_internals() + seam.missing_connector_internals(conn)
    if not gone:
        # aiohttp's own hook for the protocol of new connections
        merge = not seam.missing_reader_internals()
        conn._factory = functools.partial(StampedHandler, conn._loop, Backlog(conn._loop), habit, merge)  # type: ignore[assignment]
    return conn, gone
