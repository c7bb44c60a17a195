"""The streaming HTTP client: one request in, one `Exchange` out, with monotonic stamps.

One transport serves every streamed request of a client, http and https alike: kvbench's own
(transport.py over connection.py: each socket read stamped by the kernel as its bytes arrived,
where it can, else as the loop reads them, before any parsing (stamps.py); HTTP/1.1 framing by
llhttp), or, as an escape hatch for a server that path cannot talk to, aiohttp's public client
API (via_aiohttp.py, stamped when parsed). Either raises the same errors, which become the
record's error and kind here, in one place, with the one set of timeouts (connect_s,
first_token_s, idle_s, total_s).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from harness.config.scenario import MAX_LINE_BYTES, EndpointCfg, Timeouts
from harness.core.errors import Redactor
from harness.wire.connection import KEPT_ALIVE, ONE_PER_REQUEST, TransportError
from harness.wire.liveness import Liveness
from harness.wire.stamps import USER, Stamp
from harness.wire.stream import StreamState
from harness.wire.transport import Backend, Kvbench
from harness.wire.turns import Turns

__all__ = ["KEPT_ALIVE", "ONE_PER_REQUEST", "Exchange", "StreamingClient", "client_for", "token_limit"]
# A response may carry this many token chunks beyond twice its max_tokens before it is cut as
# too long (a server flooding tokens must not take the client's memory): engines send one chunk
# per token at most, and max_tokens bounds the tokens.
TOKEN_SLACK = 64
# A request's error message is cut to this many characters (after secrets are taken out of it)
ERROR_CHARS = 1000


# The error of a request the run's stop did not wait for (its grace ran out, or Ctrl-C was
# pressed again): the server had it, and may have answered it
STOPPED_IN_FLIGHT = (
    "cut short in flight: the run stopped and did not wait for its end (the grace ran out, or Ctrl-C "
    "was pressed again); the server may have answered it"
)


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
    error_kind: str | None = None  # "connect", "http", "timeout", "stream", "empty", "protocol", "interrupted"
    reused: bool = False  # sent on a kept-alive connection
    written: bool = False  # the request has gone to the socket (start_ns is its time)
    last_read_ns: int = 0  # the last byte the server sent for it (liveness.py)
    dead: str | None = None  # the server failed a liveness probe while this waited (liveness.py)
    resent: bool = False  # a second request of the same id, the first refused (workloads.base.Sender)
    token_limit: int = 1 << 20  # token chunks the response may carry (token_limit below)
    # The read that carried the first token: stamped by the kernel or in user space, how late the
    # client read it (kernel only), and how many later events of the response came in the same
    # read, whole or in part (its stamp is the newest data's: stamps.py)
    first_token_stamp: str = USER
    first_token_late_ns: int | None = None
    first_token_shared: int = 0

    def first_token_read(self, stamp: Stamp, later: int) -> None:
        self.first_token_stamp, self.first_token_late_ns, self.first_token_shared = stamp.source, stamp.late_ns, later

    @property
    def ok(self) -> bool:
        return self.error is None


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


def token_limit(max_tokens: int, configured: int = 0) -> int:
    """The token chunks a response with this max_tokens may carry: `configured`
    ([endpoint] max_response_tokens) when set, else twice max_tokens and TOKEN_SLACK more."""
    return configured or 2 * max_tokens + TOKEN_SLACK


class StreamingClient:
    def __init__(
        self,
        concurrency: int,
        timeouts: Timeouts,
        headers: dict[str, str],
        send_clock: bool = False,
        max_line_bytes: int = MAX_LINE_BYTES,
        transport: Literal["kvbench", "aiohttp"] = "kvbench",
        max_response_tokens: int = 0,
    ) -> None:
        self.timeouts = timeouts
        self.max_response_tokens = max_response_tokens
        reserve_descriptors(concurrency + 4)
        # send_clock: tell the embedded emulator when each request left (see its _arrival)
        # parsing shared out in turns among this client's streams and senders (turns.py)
        self.turns = Turns()
        args = (concurrency + 4, timeouts.connect_s, timeouts.idle_s, max_line_bytes, send_clock, self.turns)
        if transport == "aiohttp":
            from harness.wire.via_aiohttp import Aiohttp  # aiohttp's client is loaded only for it

            self.backend: Backend = Aiohttp(*args)
        else:
            self.backend = Kvbench(*args)
        self.redact = Redactor(headers)  # the key and header values, out of what servers send back
        self.headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **headers}
        self.backend.headers = self.headers
        self._control: aiohttp.ClientSession | None = None
        self.liveness = Liveness(timeouts.liveness_s, timeouts.liveness_probe_s, self._probe)

    async def _probe(self, url: str, within_s: float) -> bool:
        """One liveness question (liveness.py): any HTTP answer of `url` within `within_s`?"""
        try:
            async with self.session.get(url, headers=self.headers, timeout=aiohttp.ClientTimeout(total=within_s)):
                return True
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    @property
    def session(self) -> aiohttp.ClientSession:
        """The control plane's session (models, tokenize, calibration, metrics, hooks, engine
        steps): aiohttp's public client, opened when first asked for."""
        if self._control is None:
            t = self.timeouts
            # its answers come at once (no prefill to wait for, but a calibration's 2K tokens): a
            # server silent for the liveness window is not alive (the longer steps set their own)
            quiet = min(t.idle_s, t.liveness_s + t.liveness_probe_s) if t.liveness_s else t.idle_s
            self._control = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s, sock_read=quiet)
            )
        return self._control

    def health(self) -> dict[str, str]:
        """client_health: which transport sent the streams and why, where the time of a response
        byte is taken, and what the client learnt of the server's connections."""
        why = (
            '[endpoint] transport = "aiohttp" in the scenario'
            if self.backend.name == "aiohttp"
            else "the default (kvbench's own, stamped by the kernel at socket reads)"
        )
        return {
            "transport": self.backend.name,
            "transport_reason": why,
            "stamping": self.backend.stamping,
            "connections": self.backend.connections,
        }

    async def close(self) -> None:
        await self.liveness.close()
        await self.backend.close()
        if self._control is not None:
            await self._control.close()

    async def open_idle(self, url: str, n: int) -> int:
        """Have up to `n` connections to `url`'s server open and idle, without sending anything on
        them (at most the pool's room). An open loop does this before its measured part, so that
        a request sent on time does not wait for a new connection as well: in uvloop a connect
        takes a hop through its thread pool (which can wait milliseconds for a busy core), and
        more open sockets can grow the descriptor table. Returns how many were opened; none for
        a server that closes each connection after its response, or through aiohttp."""
        return await self.backend.open_idle(url, n)

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def stream(
        self, url: str, body: bytes, request_id: str, answer: list[str] | None = None, max_tokens: int = 0
    ) -> Exchange:
        """One request, sent once: whatever happens after it is written, it is the server's,
        and a failed request is recorded as failed (a resend would hide the failure, and a
        "cold" request could find the KV its first attempt built). `answer`, when given, gets the
        visible text of the response (in pieces); `max_tokens`, the request's, bounds the token
        chunks the response may carry (token_limit)."""
        t = self.timeouts
        ex = Exchange(start_ns=time.perf_counter_ns())
        if max_tokens or self.max_response_tokens:
            ex.token_limit = token_limit(max_tokens, self.max_response_tokens)
        if answer is not None:  # the answer's text is kept (sessions with real history)
            answer.clear()
            ex.state.answer = answer
        first_token_by = ex.start_ns + int(t.first_token_s * 1e9) if t.first_token_s < t.total_s else None
        try:
            async with asyncio.timeout(t.total_s) as deadline:
                with self.liveness.watching(url, ex, deadline):
                    await self.backend.exchange(url, body, request_id, ex, first_token_by)
            if ex.error is None:
                _verdict(ex)
        except TransportError as e:
            ex.error, ex.error_kind = str(e), e.kind
        except TimeoutError:
            if ex.dead is not None:
                ex.error = ex.dead
            elif ex.state.first_token_ns is None and t.first_token_s < t.total_s:
                ex.error = f"timeout: no first token within {t.first_token_s:g} s (first_token_s)"
            else:
                ex.error = f"timeout: stream not finished within {t.total_s:g} s (total_s)"
            ex.error_kind = "timeout"
        except asyncio.CancelledError:
            if not ex.written:  # nothing of it reached the server: no record, it was never sent
                raise
            ex.error, ex.error_kind = STOPPED_IN_FLIGHT, "interrupted"
            raise InFlightCancelled(ex) from None
        finally:
            ex.end_ns = time.perf_counter_ns()
            if ex.error:  # secrets out first, then the cut: a key across the cut leaves nothing behind
                ex.error = self.redact(ex.error)[:ERROR_CHARS]
        return ex


class InFlightCancelled(asyncio.CancelledError):
    """A request cancelled once it had gone to the server (the run's stop did not wait): still a
    cancellation to everything above it, but carrying its exchange, failed `interrupted`, so
    that its sender records it (workloads.base.Sender.send) before the cancellation goes on."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__()
        self.exchange = exchange


def client_for(connections: int, ep: EndpointCfg, headers: dict[str, str], send_clock: bool) -> StreamingClient:
    """The streaming client of a run (or of one of its processes) with `connections` at once."""
    return StreamingClient(
        connections, ep.timeouts, headers, send_clock, ep.max_line_bytes, ep.transport, ep.max_response_tokens
    )


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
