"""The streaming HTTP client: thin I/O around `sse.SSEDecoder` and `stream.StreamState`.

One shared aiohttp session whose connector is sized for the run's concurrency, and whose
connections stamp each socket read with `time.perf_counter_ns()` as the loop takes it, before
any parsing (arrivals.py). A streamed request to an `http://` endpoint is written and read by
kvbench itself on one of those connections (direct.py: the response parsed where each stamped
read is released, a slice at a time, turns.py). Through aiohttp (https, or an aiohttp without
the internals seam.py names) the response is read with `iter_any()` (no line or chunk limits),
split back into the pieces that arrived together, and SSE decoding takes turns with the other
streams.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl
from aiohttp.http_exceptions import HttpProcessingError

from harness.scenario import Timeouts
from harness.wire import direct, seam
from harness.wire.arrivals import SENDING, FramingError, Habit, StampedHandler, connector, take
from harness.wire.sse import MAX_LINE_BYTES, SSEDecoder, SSELimitError
from harness.wire.stream import StreamState
from harness.wire.turns import TURNS


@dataclass
class Exchange:
    """One request as the client saw it; times are monotonic ns.

    `start_ns` is when the request went to the socket (its headers with the body's first bytes,
    which aiohttp writes together): kvbench's own preparation before that (building the request
    object, taking a pooled connection) is not the server's latency. A request that never got
    that far keeps the time of the call, or of its headers' trace."""

    start_ns: int
    end_ns: int = 0
    headers_ns: int | None = None
    http_status: int | None = None
    state: StreamState = field(default_factory=StreamState)
    error: str | None = None
    error_kind: str | None = None  # "connect", "http", "timeout", "stream", "empty", "protocol"
    reused: bool = False  # sent on a kept-alive connection
    closed_before_send: bool = False  # ... which the server had closed before it was written
    closed_after_response: bool = False  # ... or was closing after its previous response
    attempts: int = 1
    retried: bool = False
    written: bool = False  # the body's first chunk has gone to the socket (start_ns is its time)

    @property
    def ok(self) -> bool:
        return self.error is None


# client_health.connections: requests reuse kept-alive connections, or (a server that closes each
# connection after its response) each opens its own
KEPT_ALIVE, ONE_PER_REQUEST = "kept alive", "one per request"
FEED_BYTES = 8192  # bytes decoded into SSE events at once, between two looks at the turn's budget


# Open files a client process keeps for other things than its connections (logs, results, pipes).
OTHER_FILES = 64


def reserve_descriptors(connections: int) -> None:
    """Make room for this many connections before the clock starts. The kernel grows a process's
    table of file descriptors as sockets open, and in a process with threads (uvloop's resolver
    pool, Ray's) each growth waits for an RCU grace period: a connection opened past 256 or 512
    open files stalled the loop for 5-7 ms mid-run (docs/performance.md). Growing the table once
    here (a descriptor duplicated at the top, then closed) avoids that; the soft limit of open
    files is raised toward the hard one when it is too low for that."""
    try:
        import fcntl
        import resource
    except ImportError:  # not a Unix: nothing to reserve
        return
    want = connections + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    top = want if soft == resource.RLIM_INFINITY else min(want, soft)
    fd = os.open(os.devnull, os.O_RDONLY)
    try:
        os.close(fcntl.fcntl(fd, fcntl.F_DUPFD, top - 1))
    except OSError:  # no free descriptor that high: the table grows as sockets open, as before
        pass
    finally:
        os.close(fd)


async def _on_headers_sent(
    _session: aiohttp.ClientSession, ctx: Any, _params: aiohttp.TraceRequestHeadersSentParams
) -> None:
    if isinstance(ctx.trace_request_ctx, Exchange):  # other calls on the session carry none
        ctx.trace_request_ctx.start_ns = time.perf_counter_ns()


async def _on_chunk_sent(
    _session: aiohttp.ClientSession, ctx: Any, _params: aiohttp.TraceRequestChunkSentParams
) -> None:
    # aiohttp holds the headers back and writes them with the body's first chunk, which (before
    # Python 3.12) it writes from a task of its own, a loop turn after the headers' trace: the
    # request leaves now.
    ex = ctx.trace_request_ctx
    if isinstance(ex, Exchange) and not ex.written:
        ex.written = True
        ex.start_ns = time.perf_counter_ns()
        TURNS.written()


class StreamingClient:
    def __init__(
        self,
        concurrency: int,
        timeouts: Timeouts,
        headers: dict[str, str],
        send_clock: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
        direct_http: bool = True,
    ) -> None:
        self.timeouts = timeouts
        self.max_line_bytes = max_line_bytes
        self.send_clock = send_clock  # tell the embedded emulator when each request left (see its _arrival)
        # http:// streams go through direct.py (False: all through aiohttp, as https always do)
        self.direct_http = direct_http
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
        # The default connector caps at 100 connections; size it for the run instead.
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(_on_headers_sent)
        trace.on_request_chunk_sent.append(_on_chunk_sent)
        self.habit = Habit()
        reserve_descriptors(concurrency + 4)
        conn, gone = connector(concurrency + 4, self.habit)
        self.connector = conn
        self._targets: dict[str, direct.Target | None] = {}
        # Where response bytes are stamped (seam.py): at socket reads, unless aiohttp changed.
        self.stamping = seam.PARSE_TIME if gone else seam.SOCKET_READ
        self.stamping_warning = seam.warning(gone) if gone else None
        self.session = aiohttp.ClientSession(
            connector=conn,
            trace_configs=[trace],
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s, sock_read=timeouts.idle_s),
            read_bufsize=1 << 20,
            auto_decompress=False,
        )

    async def close(self) -> None:
        await self.session.close()

    async def open_idle(self, url: str, n: int) -> int:
        """Have at least `n` connections to `url`'s server idle in the pool (at most the pool's
        size), without sending anything on them. An open loop does this before its measured part,
        so that a request sent on time does not wait for a new connection as well: in uvloop a
        connect takes a hop through its thread pool (which can wait milliseconds for a busy core),
        and more open sockets can grow the descriptor table. Returns how many connections were
        taken; none for a server that closes each connection after its response, or where
        aiohttp's (public, but low-level) connector API has changed."""
        if n <= 0 or self.habit.closes_after_response:
            return 0
        conn = self.session.connector
        assert conn is not None
        try:
            req = aiohttp.ClientRequest("GET", yarl.URL(url), loop=asyncio.get_running_loop(), session=self.session)
            got = await asyncio.gather(
                *(conn.connect(req, [], self.session.timeout) for _ in range(min(n, conn.limit or n))),
                return_exceptions=True,
            )
        except (TypeError, AttributeError):  # a changed API: connections open as requests need them
            return 0
        held = [c for c in got if isinstance(c, aiohttp.connector.Connection)]
        for c in held:
            c.release()  # back to the pool, idle and unused
        return len(held)

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    @property
    def connections(self) -> str:
        """client_health.connections: how requests found their connections."""
        return ONE_PER_REQUEST if self.habit.closes_after_response else KEPT_ALIVE

    async def stream(self, url: str, body: bytes, request_id: str, answer: list[str] | None = None) -> Exchange:
        """One request. It is sent a second time only when it never reached the server: it
        failed to connect on a kept-alive connection whose EOF from the server was already
        there when the request was written (servers close idle connections after a few
        seconds), or that the server was closing, unasked, right after its previous response
        (arrivals.CLOSE_AFTER_RESPONSE_NS). Then once more, on a new connection, and the record
        says so. Anything else, including a server that closes a connection after it has read
        the request, is a failed request: a resend would hide it, and a "cold" request could
        find the KV its first attempt built. `answer`, when given, gets the visible text of the
        response (in pieces)."""
        ex = await self._attempt(url, body, request_id, answer)
        if ex.error_kind == "connect" and (ex.closed_before_send or ex.closed_after_response):
            ex = await self._attempt(url, body, request_id, answer)  # once: a new connection is not stale
            ex.attempts, ex.retried = 2, True
        return ex

    async def _attempt(self, url: str, body: bytes, request_id: str, answer: list[str] | None) -> Exchange:
        t = self.timeouts
        loop = asyncio.get_running_loop()
        total_deadline = loop.time() + t.total_s
        ex = Exchange(start_ns=time.perf_counter_ns())
        if answer is not None:  # the answer's text is kept (sessions with real history)
            answer.clear()
            ex.state.answer = answer
        sending = SENDING.set(ex)
        try:
            target = self._target(url)
            if target is not None:  # the first token's deadline is the reader's (direct.py)
                first_token_by = ex.start_ns + int(t.first_token_s * 1e9) if t.first_token_s < t.total_s else None
                async with asyncio.timeout(t.total_s):
                    await self._direct(target, body, request_id, ex, first_token_by)
            else:
                async with asyncio.timeout(min(t.first_token_s, t.total_s)) as deadline:
                    await self._via_aiohttp(url, body, request_id, ex, deadline, total_deadline)
        # aiohttp's own timeouts are TimeoutErrors too: they must be told apart first.
        except aiohttp.ConnectionTimeoutError:
            ex.error, ex.error_kind = f"timeout: no connection within {t.connect_s:g} s (connect_s)", "connect"
        except aiohttp.ServerTimeoutError:
            ex.error, ex.error_kind = f"timeout: no data for {t.idle_s:g} s (idle_s)", "timeout"
        except TimeoutError:
            if ex.state.first_token_ns is None and t.first_token_s < t.total_s:
                ex.error = f"timeout: no first token within {t.first_token_s:g} s (first_token_s)"
            else:
                ex.error = f"timeout: stream not finished within {t.total_s:g} s (total_s)"
            ex.error_kind = "timeout"
        # the server's HTTP (or SSE) broke its own rules (aiohttp's pure-Python parser raises its own errors)
        except (FramingError, SSELimitError, aiohttp.ClientResponseError, HttpProcessingError) as e:
            ex.error, ex.error_kind = f"protocol: {e}", "protocol"
        except aiohttp.ClientConnectorError as e:
            ex.error, ex.error_kind = f"connection failed: {e}", "connect"
        except (aiohttp.ClientError, ConnectionError) as e:
            ex.error, ex.error_kind = f"{type(e).__name__}: {e}", "connect" if ex.http_status is None else "stream"
        finally:
            ex.end_ns = time.perf_counter_ns()
            SENDING.reset(sending)
        return ex

    def _target(self, url: str) -> direct.Target | None:
        """The URL made ready for the direct exchange; None where aiohttp sends (https, or an
        aiohttp without the internals for stamping)."""
        try:
            return self._targets[url]
        except KeyError:
            pass
        found = None
        if self.direct_http and self.stamping == seam.SOCKET_READ and yarl.URL(url).scheme == "http":
            found = direct.target(url, self.headers, self.session)
        self._targets[url] = found
        return found

    async def _direct(
        self, target: direct.Target, body: bytes, request_id: str, ex: Exchange, first_token_by: int | None
    ) -> None:
        """One exchange written and read by kvbench itself (direct.py), on a pooled connection."""
        try:
            conn = await self.connector.connect(target.request, [], self.session.timeout)
        except TimeoutError as e:  # the connector's own (connect_s); the request's deadline cancels instead
            raise aiohttp.ConnectionTimeoutError(f"connection timeout to {target.request.url}") from e
        handler = conn.protocol
        assert isinstance(handler, StampedHandler)  # the connector's factory (else no target)
        reader = direct.Reader(ex, handler, self.max_line_bytes, self.timeouts.idle_s, first_token_by)
        handler.begin(ex)
        reuse = False
        try:
            if first_token_by is not None and time.perf_counter_ns() >= first_token_by:
                raise TimeoutError  # waited for a connection past the first token's time: not sent
            transport = handler.transport
            if transport is None or transport.is_closing():
                raise aiohttp.ServerDisconnectedError("the connection closed before the request was written")
            handler.reader = reader
            closing = self.habit.closes_after_response
            data = target.encode(body, request_id, closing, ex.start_ns if self.send_clock else None)
            ex.start_ns, ex.written = time.perf_counter_ns(), True
            TURNS.written()
            transport.write(data)
            reader.start()
            await reader.finished
            if reader.failure is not None:
                raise reader.failure
            reuse = reader.response.reusable() and not self.habit.closes_after_response
        finally:
            handler.reader = None
            reader.stop()
            if reuse:
                conn.release()
            else:
                conn.close()
        if reader.response.error_body is not None:
            ex.error, ex.error_kind = f"HTTP {ex.http_status}: {reader.response.error_text()}", "http"
        else:
            _verdict(ex)

    async def _via_aiohttp(
        self, url: str, body: bytes, request_id: str, ex: Exchange, deadline: asyncio.Timeout, total_deadline: float
    ) -> None:
        headers = {**self.headers, "X-Request-Id": request_id}
        if self.habit.closes_after_response:  # its connections end with each response anyway
            headers["Connection"] = "close"
        if self.send_clock:
            headers[seam.SENT_HEADER] = str(ex.start_ns)
        async with self.session.post(url, data=body, headers=headers, trace_request_ctx=ex) as resp:
            ex.headers_ns = time.perf_counter_ns()
            ex.http_status = resp.status
            if resp.status != 200:
                text = (await resp.content.read(65536)).decode("utf-8", "replace")
                ex.error, ex.error_kind = f"HTTP {resp.status}: {text.strip()[:1000]}", "http"
                return
            await self._read(resp, ex, deadline, total_deadline)  # leaving the block on an error closes the connection

    async def _read(
        self, resp: aiohttp.ClientResponse, ex: Exchange, deadline: asyncio.Timeout, total_deadline: float
    ) -> None:
        state = ex.state
        decoder = SSEDecoder(self.max_line_bytes, skip=state.run_end)
        rescheduled = False
        # The response's protocol, not resp.connection: aiohttp lets go of the connection as soon
        # as the whole body is in, which for a short answer is before this line.
        handler = getattr(resp, "_protocol", None)
        if isinstance(handler, StampedHandler):
            arrivals = handler.arrivals_of(resp.content)
        else:
            arrivals = []  # no stamps: `take` stamps the bytes as they are read here
            if self.stamping == seam.SOCKET_READ:
                self.stamping = seam.PARSE_TIME
                self.stamping_warning = seam.warning(("ClientResponse._protocol",))
        async for chunk in resp.content.iter_any():
            # iter_any hands over everything received since the last read: split it back into
            # the pieces the socket delivered, each with the time it arrived.
            pos = 0
            for t, n in take(arrivals, len(chunk), time.perf_counter_ns()):
                state.on_bytes(t)
                for cut in range(pos, pos + n, FEED_BYTES):  # a piece can be 256 KB: split the work
                    events = decoder.feed(chunk[cut : min(cut + FEED_BYTES, pos + n)])
                    if events:
                        if TURNS.spent():
                            await TURNS.wait()
                        state.on_events(events, t)
                pos += n
            if state.first_token_ns is not None and not rescheduled:
                deadline.reschedule(total_deadline)
                rescheduled = True
            if state.done or state.error:
                break
        else:
            state.on_events(decoder.close(), time.perf_counter_ns())
        _verdict(ex)


def _verdict(ex: Exchange) -> None:
    """A stream that was read to its end (or [DONE]): failed, if what it said was not a
    complete answer."""
    state = ex.state
    if state.error:
        ex.error, ex.error_kind = f"error in stream: {state.error}", "stream"
    elif not state.done and state.finish_reason is None:
        ex.error, ex.error_kind = "stream ended before [DONE]", "stream"
    elif state.first_token_ns is None:
        ex.error, ex.error_kind = "the response carried no token", "empty"
