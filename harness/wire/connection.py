"""kvbench's streaming connections: one `asyncio.Protocol` per connection, a pool of them, and
the backlog that parses what they read, on public asyncio APIs only (`loop.create_connection`,
with `ssl=` for https, so that TLS streams get the same stamps and the same path).

When each response byte arrived is taken as the loop reads the socket, before any parsing: the
event loop reads every ready socket in one go and hands each read to its protocol at once, and
parsing a 40 KB burst of 256 events there would stamp the next connection's bytes late. So a
`Connection` only stamps and holds each read; the `Backlog` hands the reads to their exchanges'
readers afterwards, in turns: at most RELEASE_BYTES of one connection, then the next connection's,
a slice of time (turns.SLICE_NS) at most, so that the loop gets back to the sockets in between
and a connection that floods cannot starve the others.

The `Pool` keeps idle connections for reuse (most recently used first), at most `limit` open,
closes idle ones before the servers kvbench meets would (KEEPALIVE_S), and learns whether the
server keeps connections alive at all: until a connection has stayed open CLOSE_AFTER_RESPONSE_S
after a response, no request is written on a used connection (`Habit`). A server that closes each
connection after its response (the pinned llama.cpp does, without `Connection: close`) is thus
found before any request races its close, and gets a connection per request from then on. No
request is ever sent twice: a used connection the server has closed is dropped before anything
is written on it (`closed_by_peer`), and a request written is the server's, whatever happens next.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from harness.wire.turns import SLICE_NS, TURNS

RELEASE_BYTES = 8192  # of one connection's held bytes handed on at once (about 50 SSE events)
# Bytes one connection may hold unparsed: beyond this, reading pauses until the backlog has
# caught up to half of it, so a server that sends faster than it can be parsed holds at most this.
HOLD_BYTES = 1 << 20
# An idle pooled connection is closed after this long, before the servers kvbench meets close it
# themselves (llama.cpp's and uvicorn's, vLLM's, keep-alive is 5 s): a request written just as the
# server closes its end would fail with no proof it was never read.
KEEPALIVE_S = 4.0
# A connection that stays open this long after a complete response proves the server keeps
# connections alive; one closed sooner, that it closes each after its response.
CLOSE_AFTER_RESPONSE_S = 0.05
CLOSE_WAIT_S = 2.0
# What poll says of a connection the server has closed or reset (Linux); elsewhere a peek tells
_HANGUP = (select.POLLRDHUP | select.POLLHUP | select.POLLERR) if hasattr(select, "POLLRDHUP") else 0


class TransportError(Exception):
    """A request's exchange failed below HTTP's meaning. `kind` is the record's error kind."""

    kind = "connect"


class ConnectFailed(TransportError):
    """No connection could be opened (refused, unreachable, TLS handshake failed, or connect_s)."""


class Disconnected(TransportError):
    """The server ended the connection before any byte of an answer."""


class CutShort(TransportError):
    """The server ended the connection inside its answer."""

    kind = "stream"


class IdleTimeout(TransportError):
    """The server sent nothing for idle_s."""

    kind = "timeout"


class BrokenFraming(TransportError):
    """The server's HTTP (or SSE) broke its own rules."""

    kind = "protocol"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a pool's connections go: one per (scheme, host, port)."""

    tls: bool
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = u.scheme == "https"
        return cls(tls, u.hostname, u.port or (443 if tls else 80))


class Reader(Protocol):
    """What reads one response on a connection (transport.Reader)."""

    def feed(self, t_ns: int, data: bytes) -> None: ...
    def eof(self) -> None: ...
    def lost(self, exc: BaseException | None) -> None: ...


# client_health.connections: requests reuse kept-alive connections, or (a server that closes each
# connection after its response) each opens its own
KEPT_ALIVE, ONE_PER_REQUEST = "kept alive", "one per request"


class Habit:
    """What the pool has learnt of the server's connections."""

    UNKNOWN, KEEPS, CLOSES = "unknown", "keeps alive", "closes after each response"

    def __init__(self) -> None:
        self.state = Habit.UNKNOWN

    @property
    def closes_after_response(self) -> bool:
        return self.state == Habit.CLOSES

    @property
    def connections(self) -> str:
        return ONE_PER_REQUEST if self.closes_after_response else KEPT_ALIVE


class Backlog:
    """Reads held by a pool's connections, released a slice per loop turn, in turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.conns: deque[Connection] = deque()
        self.scheduled = False

    def add(self, conn: Connection) -> None:
        self.conns.append(conn)
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        start = now = time.perf_counter_ns()
        conns = self.conns
        try:
            while conns and now - start < SLICE_NS and not TURNS.send_near(now):
                conn = conns.popleft()
                if conn.held:
                    conn.release_one()
                if conn.held:  # to the back: every connection gets its turn
                    conns.append(conn)
                now = time.perf_counter_ns()
        finally:  # a reader that broke must not stop the others
            self.scheduled = bool(conns)
            if self.scheduled:
                self.loop.call_soon(self._drain)


class Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: each read stamped on arrival and held for the backlog, which
    hands it to the `reader` of the exchange in flight."""

    def __init__(self, pool: Pool, origin: Origin) -> None:
        self.pool, self.origin = pool, origin
        self.transport: asyncio.Transport | None = None
        self.held: deque[tuple[int, bytes]] = deque()
        self.held_bytes = 0
        self.paused = False
        self.reader: Reader | None = None
        self.served = 0  # requests written here
        self.closed = False  # the server's EOF (or a reset) has been seen, or the client closed it
        self.last_read_ns = 0  # when the last read arrived
        self.idle_since = 0.0  # loop time of its release to the pool
        self._hangup: select.poll | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        TURNS.polled(now)
        self.last_read_ns = now
        if self.reader is None and not self.held:  # bytes no request asked for: not reusable
            self.close()
            return
        self.held.append((now, data))
        self.held_bytes += len(data)
        if len(self.held) == 1:
            self.pool.backlog.add(self)
        if self.held_bytes > HOLD_BYTES and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        self.release_all()
        self.closed = True
        self.pool.closed_by_server(self)
        if self.reader is not None:
            self.reader.eof()
        return None  # close the transport

    def connection_lost(self, exc: BaseException | None) -> None:
        self.release_all()
        if not self.closed:
            self.closed = True
            self.pool.closed_by_server(self)
        self.pool.gone(self)
        if self.reader is not None:
            self.reader.lost(exc)

    def release_all(self) -> None:
        while self.held:
            self.release_one()

    def release_one(self) -> None:
        """Hand the reader the oldest held read, or its first RELEASE_BYTES, cut where a chunk of
        an SSE event most likely ends (LF, then the chunk's CRLF): the next slice then starts at a
        chunk boundary, where the parser's fast path can take a run at once (a slice cut inside
        a chunk costs a search and a partial parse; correct either way)."""
        t, data = self.held[0]
        if len(data) > RELEASE_BYTES:
            cut = data.rfind(b"\n\r\n", 0, RELEASE_BYTES) + 3
            if cut < RELEASE_BYTES // 2:
                cut = RELEASE_BYTES
            self.held[0] = (t, data[cut:])
            data = data[:cut]
        else:
            self.held.popleft()
        self.held_bytes -= len(data)
        if self.paused and self.held_bytes <= HOLD_BYTES // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        if self.reader is not None:
            self.reader.feed(t, data)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.served += 1
        self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def closed_by_peer(self) -> bool:
        """Has the server closed this connection? Its EOF may wait in the socket unread: ask the
        kernel (poll for a hang-up, where there is POLLRDHUP), else peek."""
        if self.closed or self.transport is None or self.transport.is_closing():
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
        peek = socket.socket(sock.family, sock.type, fileno=sock.fileno())
        try:
            return peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # open, nothing pending
        except OSError:
            return True  # reset by the server
        finally:
            peek.detach()


class Pool:
    """At most `limit` connections, opened within `connect_s`, kept for reuse."""

    def __init__(self, limit: int, connect_s: float) -> None:
        self.limit, self.connect_s = limit, connect_s
        self.loop = asyncio.get_running_loop()
        self.backlog = Backlog(self.loop)
        self.habit = Habit()
        self.idle: dict[Origin, list[Connection]] = {}
        self.probation: set[Connection] = set()  # used, not yet proven to stay open (Habit.UNKNOWN)
        self.open = 0  # connections open or opening
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.all_closed: asyncio.Future[None] | None = None  # close(): until every transport is gone
        self._ssl: ssl.SSLContext | None = None

    async def acquire(self, origin: Origin) -> Connection:
        """An idle connection to `origin` that the server has not closed, else a new one."""
        while True:
            conn = self._take_idle(origin)
            if conn is not None:
                return conn
            # (connections in probation do not count: none of them may be written on yet, and
            # a request that waited for one would wait CLOSE_AFTER_RESPONSE_S, once, at the start)
            if self.open - len(self.probation) < self.limit:
                return await self._connect(origin)
            waiter = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.cancelled():
                    with contextlib.suppress(ValueError):  # (a wake-up may have passed it over)
                        self.waiters.remove(waiter)
                else:  # woken and cancelled at once: the wake-up is another's
                    self._wake()
                raise

    def _take_idle(self, origin: Origin) -> Connection | None:
        idle = self.idle.get(origin)
        now = self.loop.time()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < KEEPALIVE_S and not conn.closed_by_peer():
                return conn
            conn.close()  # the server may close it any moment now, or has: never written on
        return None

    async def _connect(self, origin: Origin) -> Connection:
        self.open += 1
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=self._tls() if origin.tls else None,
                    server_hostname=origin.host if origin.tls else None,
                )
        except TimeoutError as e:
            self._lost_one()
            raise ConnectFailed(f"timeout: no connection within {self.connect_s:g} s (connect_s)") from e
        except (OSError, ssl.SSLError) as e:
            self._lost_one()
            raise ConnectFailed(f"connection failed: {origin.host}:{origin.port}: {e}") from e
        except BaseException:
            self._lost_one()
            raise
        return conn

    def _tls(self) -> ssl.SSLContext:
        """The default TLS context (system CAs, or $SSL_CERT_FILE), with HTTP/1.1 offered by ALPN."""
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
            self._ssl.set_alpn_protocols(["http/1.1"])
        return self._ssl

    def release(self, conn: Connection, reusable: bool) -> None:
        """The exchange on `conn` is over; keep the connection if it may carry another request."""
        conn.reader = None
        if not reusable or conn.closed or self.habit.closes_after_response:
            conn.close()
        elif self.habit.state == Habit.UNKNOWN:
            self.probation.add(conn)
            self.loop.call_later(CLOSE_AFTER_RESPONSE_S, self._proven, conn)
        else:
            self._idle(conn)
        self._wake()

    def _proven(self, conn: Connection) -> None:
        """A used connection's probation is over: still open, the server keeps connections alive."""
        if conn not in self.probation:
            return
        self.probation.discard(conn)
        if conn.closed_by_peer():
            conn.close()
            self.closed_by_server(conn)
            return
        freed = 1
        if self.habit.state == Habit.UNKNOWN:
            self.habit.state = Habit.KEEPS
            for other in self.probation:  # each proves no more than this one
                self._idle(other)
            freed += len(self.probation)
            self.probation.clear()
        self._idle(conn)
        self._wake(freed)

    def _idle(self, conn: Connection) -> None:
        conn.idle_since = self.loop.time()
        self.idle.setdefault(conn.origin, []).append(conn)

    def closed_by_server(self, conn: Connection) -> None:
        """The server ended `conn`. Ended in its probation: it closes each connection after its
        response."""
        if conn in self.probation:
            self.probation.discard(conn)
            if self.habit.state == Habit.UNKNOWN:
                self.habit.state = Habit.CLOSES
        idle = self.idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    def gone(self, conn: Connection) -> None:
        """The connection's transport is closed (connection_lost)."""
        self.closed_by_server(conn)
        self._lost_one()

    def _lost_one(self) -> None:
        self.open -= 1
        self._wake()
        if self.open == 0 and self.all_closed is not None:
            self.all_closed.set_result(None)

    def _wake(self, n: int = 1) -> None:
        """Wake the `n` longest waiters for a connection (one for each that became free)."""
        while self.waiters and n > 0:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                n -= 1

    async def open_idle(self, origin: Origin, n: int) -> int:
        """Open up to `n` connections (at most the pool's room) and keep them idle; how many."""
        if self.habit.closes_after_response:
            return 0
        room = min(n, self.limit - self.open)
        got = await asyncio.gather(*(self._connect(origin) for _ in range(room)), return_exceptions=True)
        conns = [c for c in got if isinstance(c, Connection)]
        for c in conns:
            self._idle(c)
        return len(conns)

    async def close(self) -> None:
        """Close every connection and wait (CLOSE_WAIT_S at most) until their transports are
        gone: a TLS connection's close waits for the server's answer to its close_notify, and a
        loop closed before that leaves the socket open."""
        for conns in self.idle.values():
            for c in conns:
                c.close()
        self.idle.clear()
        for c in self.probation:
            c.close()
        self.probation.clear()
        if self.open > 0:
            self.all_closed = self.loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.all_closed, CLOSE_WAIT_S)
