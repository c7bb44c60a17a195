"""kvbench's own HTTP/1.1 exchange for streamed requests to `http://` endpoints.

The request goes out as one write of bytes built from a per-URL head. Its response is read in the
loop's drain of stamped reads (arrivals.Backlog): each read, as it is released, goes through the
HTTP parser (h1.py), the SSE decoder (sse.py) and the stream's state (stream.py) there and then,
and the request's task wakes once, at the end. aiohttp's connector still opens, pools and expires
the connections, and StampedHandler still stamps their reads; aiohttp's request and response
machinery, which cost the client about 40 % of its CPU at its ceiling (docs/performance.md), is
not used. https endpoints, and an aiohttp without the internals seam.py names, go through
aiohttp as before (client.py), with the same records.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
import yarl

from harness import __version__
from harness.wire import h1
from harness.wire.arrivals import FramingError
from harness.wire.seam import SENT_HEADER
from harness.wire.sse import SSEDecoder, SSELimitError

if TYPE_CHECKING:
    from harness.wire.arrivals import StampedHandler
    from harness.wire.client import Exchange

ERROR_BODY_BYTES = 65536  # of a response that is not 200: what its error message is taken from
# Headers kvbench writes itself (from the body and the connection's use), whatever a user gives
_OWN = frozenset(("content-length", "transfer-encoding", "connection", "x-request-id"))


@dataclass(frozen=True)
class Target:
    """An endpoint URL made ready once: the connector's request, and the constant part of the
    request's head."""

    request: aiohttp.ClientRequest  # what aiohttp's connector keys its pool by (never sent)
    head: bytes

    def encode(self, body: bytes, request_id: str, close: bool, sent_ns: int | None) -> bytes:
        extra = b"X-Request-Id: %s\r\n" % request_id.encode()
        if close:
            extra += b"Connection: close\r\n"
        if sent_ns is not None:
            extra += b"%s: %d\r\n" % (SENT_HEADER.encode(), sent_ns)
        return b"%s%sContent-Length: %d\r\n\r\n%s" % (self.head, extra, len(body), body)


def target(url: str, headers: dict[str, str], session: aiohttp.ClientSession) -> Target:
    u = yarl.URL(url)
    lines = [f"POST {u.raw_path_qs} HTTP/1.1"]
    given = {k.lower() for k in headers}
    if "host" not in given:
        lines.append(f"Host: {u.host_port_subcomponent}")
    if "user-agent" not in given:
        lines.append(f"User-Agent: kvbench/{__version__}")
    for k, v in headers.items():
        if k.lower() in _OWN:
            continue
        if any(c in k + v for c in "\r\n\0"):  # cli.py refuses these; never split a request
            raise ValueError(f"header {k!r} has a line break")
        lines.append(f"{k}: {v}")
    request = aiohttp.ClientRequest("POST", u, loop=asyncio.get_running_loop(), session=session)
    return Target(request, ("\r\n".join(lines) + "\r\n").encode())


class Response:
    """One response's bytes to what they say (pure, no I/O): its HTTP framing (h1), its SSE
    (sse), what the stream says (stream, into `ex.state`), or, for a status other than 200, its
    first bytes. Runs of whole HTTP chunks that are each one token event of the stream's template
    are taken from the raw bytes, framing and all (StreamState.chunked_run_end); everything else is
    decoded from the body. `feed` raises h1.ProtocolError and SSELimitError."""

    __slots__ = ("decoder", "error_body", "ex", "over", "parser", "t")

    def __init__(self, ex: Exchange, max_line_bytes: int) -> None:
        self.ex = ex
        self.parser = h1.ResponseParser()
        self.decoder = SSEDecoder(max_line_bytes, skip=ex.state.run_end)
        self.error_body: list[bytes] | None = None  # a response that is not 200: its first bytes
        self.t = 0  # the stamp of the read being fed
        self.over = False  # the exchange has ended: only the framing is read on

    def feed(self, t: int, data: bytes) -> None:
        self.t = t
        self.parser.feed(data, self._body, self._skip)
        self._headers()
        state = self.ex.state
        if self.parser.done and self.error_body is None and not (self.over or state.done or state.error):
            state.on_events(self.decoder.close(), t)

    def _headers(self) -> None:
        ex, head = self.ex, self.parser.head
        if ex.http_status is None and head is not None:
            ex.http_status, ex.headers_ns = head.status, self.t
            if head.status != 200:
                self.error_body = []

    def _body(self, data: bytes) -> None:
        """Body bytes, in order (h1's callback)."""
        if self.over or not data:
            return
        self._headers()
        if self.error_body is not None:
            if sum(map(len, self.error_body)) < ERROR_BODY_BYTES:
                self.error_body.append(data)
            return
        state = self.ex.state
        if state.done:  # nothing after [DONE] counts (after an error, the read is decoded to its end, as via aiohttp)
            return
        if state.first_byte_ns is None:
            state.first_byte_ns = self.t
        events = self.decoder.feed(data)
        if events:
            state.on_events(events, self.t)

    def _skip(self, buf: bytes, start: int) -> int:
        """h1's skip: a run of whole token chunks from `start`, unless the SSE decoder is inside
        an event there (or there is no template yet)."""
        state = self.ex.state
        if state.template is None or self.over or state.done:
            return start
        self._headers()
        if self.error_body is not None or not self.decoder.between_events():
            return start
        end = state.chunked_run_end(buf, start)
        if end > start:
            # four LFs a chunk: after its size, its event's line and blank line, after its data
            state.take_run(state.template, buf, start, end, buf.count(b"\n", start, end) // 4, self.t)
        return end

    def ended(self) -> bool:
        """Is there nothing more to wait for: the body's end, enough of an error's body, or
        [DONE] (or an error event) in the stream?"""
        if self.parser.done:
            return True
        if self.error_body is not None:
            return sum(map(len, self.error_body)) >= ERROR_BODY_BYTES
        return self.ex.state.done or self.ex.state.error is not None

    def reusable(self) -> bool:
        """May the connection carry another request?"""
        p = self.parser
        return p.done and not p.extra and p.head is not None and p.head.keep_alive

    def error_text(self) -> str:
        body = b"".join(self.error_body or ())[:ERROR_BODY_BYTES]
        return body.decode("utf-8", "replace").strip()[:1000]


class Reader:
    """Reads one response on its connection's handler (`handler.reader`): fed each stamped read
    as the backlog releases it, and at the connection's end. `finished` resolves when the
    exchange is over (the stream's end, [DONE], an error, a timeout); `failure` then says why it
    failed, if it did."""

    __slots__ = ("ex", "failure", "finished", "first_token_by", "handler", "idle_ns", "loop", "response", "timer")

    def __init__(
        self, ex: Exchange, handler: StampedHandler, max_line_bytes: int, idle_s: float, first_token_by: int | None
    ) -> None:
        self.ex, self.handler = ex, handler
        self.loop = asyncio.get_running_loop()
        self.response = Response(ex, max_line_bytes)
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.failure: BaseException | None = None
        self.idle_ns = int(idle_s * 1e9)
        # (perf_counter_ns) the first token is due by then (first_token_s), None: only the total
        # timeout applies, which the request's task keeps
        self.first_token_by = first_token_by
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """The request is written: the timer (no data for idle_s, no first token in time) runs."""
        self._check()

    def feed(self, t: int, data: bytes) -> None:
        response = self.response
        try:
            response.feed(t, data)
        except h1.ProtocolError as e:
            response.parser.extra = b"broken"  # not reusable
            self._end(FramingError(f"broken HTTP framing: {e}"))
            return
        except SSELimitError as e:
            self._end(e)
            return
        if response.parser.done and self.handler.done_ns is None:
            self.handler.done_ns = t  # (arrivals.py: does the server close connections after responses?)
        # After [DONE], the body's end is read on from the reads already in, so that the
        # connection can be reused; if it is not there yet, the connection is closed.
        if not self.finished.done() and response.ended() and (response.parser.done or not self.handler.held):
            self._end(None)

    def eof(self) -> None:
        """The server ended the connection (its held reads were fed first)."""
        if self.finished.done():
            return
        try:
            self.response.parser.eof()
        except h1.ProtocolError as e:
            self._lost(str(e))
            return
        self.feed(self.handler.last_read_ns, b"")  # a body that ran to the connection's end is complete

    def lost(self, exc: BaseException | None) -> None:
        if not self.finished.done():
            self._lost(f"connection lost: {exc}" if exc else "the server closed the connection")

    def _lost(self, why: str) -> None:
        if self.ex.http_status is None:  # no answer at all: as aiohttp says it (a "connect" failure)
            self._end(aiohttp.ServerDisconnectedError(why))
        else:
            self._end(aiohttp.ClientPayloadError(f"response cut short: {why}"))

    def _check(self) -> None:
        """Fail the exchange once its server has been quiet for idle_s, or its first token is
        late; else look again when either could next be true. One timer, moved only when it
        fires: nothing is done for it per read."""
        now = time.perf_counter_ns()
        left = self.idle_ns - (now - max(self.handler.last_read_ns, self.ex.start_ns))
        if left <= 0:
            self._end(aiohttp.ServerTimeoutError("no data"))
            return
        if self.first_token_by is not None and self.ex.state.first_token_ns is None:
            if now >= self.first_token_by:
                self._end(TimeoutError())
                return
            left = min(left, self.first_token_by - now)
        self.timer = self.loop.call_later(left / 1e9, self._check)

    def _end(self, failure: BaseException | None) -> None:
        if not self.finished.done():
            self.failure = failure
            self.response.over = True
            self.finished.set_result(None)
        self.stop()

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
