"""kvbench's streaming connections: one non-blocking socket per connection, read with `recvmsg`
so that the kernel stamps each read's arrival (stamps.py), a pool of them, and the backlog that
parses what they read, on public asyncio APIs only (`loop.sock_connect`, `loop.add_reader`); for
https, `ssl.SSLObject` over memory BIOs on the same raw reads, so that TLS streams get the same
stamps and the same path (the first decrypted token takes the stamp of the read that completed
its TLS record).

A `Connection` stamps and holds each read; the `Backlog` hands the reads to their exchanges'
readers afterwards, one read of one connection, then the next connection's, for a slice of time
(turns.SLICE_NS) at most, so that a connection that floods cannot starve the others and an open
loop's due send is not held behind parsing. The stamps no longer depend on when parsing happens:
the kernel took them.

The `Pool` keeps idle connections for reuse (most recently used first), at most `limit` open,
closes idle ones before the servers kvbench meets would (KEEPALIVE_S), and learns whether the
server keeps connections alive at all: until a connection has stayed open CLOSE_AFTER_RESPONSE_S
after a response, no request is written on a used connection (`Habit`). A server that closes each
connection after its response (the pinned llama.cpp does, without `Connection: close`) is thus
found before any request races its close, and gets a connection per request from then on, as
does one that closes a kept-alive connection, unanswered, after a request was written on it. No
request is ever sent twice: a used connection the server has closed is dropped before anything
is written on it (`closed_by_peer`), and a request written is the server's, whatever happens next.

A connection whose exchange still awaits its first token is also in its client's
`turns.FirstTokenWatch`, and read as soon as the loop, busy reading and parsing the others, next
looks: Linux merges a socket's queued segments, and a read carries the newest one's stamp, so a
first token read after the next token arrived would take that token's time.

Once a request's last byte is with the kernel, the connection asks it to acknowledge what comes
back at once (`TCP_QUICKACK`, Linux): a send puts Linux's receiver into delayed acknowledgement
(40 ms at least), and a server that writes its response's head and then its first token as two
small writes without TCP_NODELAY (Dynamo 1.6.1's frontend does) holds the token until the head
is acknowledged. Measured on a kept-alive connection to it: a first token the mocker gave at
once arrived 44 ms late in about a third of requests, and in none with the flag set after the
send. Set before the send, the send undoes it.
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

from harness.wire import stamps
from harness.wire.stamps import Stamp
from harness.wire.turns import SLICE_NS, Turns

READ_BYTES = 65536  # asked of the kernel per read
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
# Linux's acknowledge-at-once flag (the module docstring says why); elsewhere none is asked for
QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
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


# What a server's bytes can make the parsing of a response raise (a JSON nested past Python's
# recursion limit, a value of the wrong type): it fails that request only, never the loop.
UNREADABLE = (ValueError, TypeError, AttributeError, AssertionError, RecursionError)


def unreadable(e: BaseException) -> str:
    return f"protocol: the response could not be read: {type(e).__name__}: {str(e)[:200]}"


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

    def feed(self, stamp: Stamp, data: bytes) -> None: ...
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
    """Reads held by a pool's connections, released a read per connection in turn, for a slice
    of time per loop turn, the first-token watch asked between two."""

    def __init__(self, loop: asyncio.AbstractEventLoop, turns: Turns) -> None:
        self.loop = loop
        self.turns = turns
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
            while conns and now - start < SLICE_NS and not self.turns.send_near(now):
                conn = conns.popleft()
                if conn.held:
                    conn.release_one()
                if conn.held:  # to the back: every connection gets its turn
                    conns.append(conn)
                now = time.perf_counter_ns()
                self.turns.watch.check(now)
        finally:  # a reader that broke must not stop the others
            self.scheduled = bool(conns)
            if self.scheduled:
                self.loop.call_soon(self._drain)


class TLS:
    """One connection's TLS: an `ssl.SSLObject` over memory BIOs, fed the socket's raw reads."""

    __slots__ = ("incoming", "obj", "outgoing")

    def __init__(self, context: ssl.SSLContext, host: str) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = context.wrap_bio(self.incoming, self.outgoing, server_hostname=host)

    async def handshake(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        while True:
            try:
                self.obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                if out := self.outgoing.read():
                    await loop.sock_sendall(sock, out)
                data = await loop.sock_recv(sock, READ_BYTES)
                if not data:
                    raise ConnectionResetError("the server closed the connection during the TLS handshake") from None
                self.incoming.write(data)
        if out := self.outgoing.read():
            await loop.sock_sendall(sock, out)

    def decrypt(self, data: bytes) -> tuple[bytes, bool]:
        """The plaintext that these raw bytes complete (b"" at the end of the stream), and
        whether the TLS stream has ended (close_notify, or the connection's end). Raises
        ssl.SSLError."""
        if data:
            self.incoming.write(data)
        else:
            self.incoming.write_eof()
        out: list[bytes] = []
        while True:
            try:
                piece = self.obj.read(READ_BYTES)
            except ssl.SSLWantReadError:
                return b"".join(out), False
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b"".join(out), True
            if not piece:
                return b"".join(out), True
            out.append(piece)

    def encrypt(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def goodbye(self) -> bytes:
        """A close_notify, where the session can still send one."""
        with contextlib.suppress(ssl.SSLError, ValueError):
            self.obj.unwrap()
        return self.outgoing.read()


class HeldReads:
    """A connection's reads not yet handed on, oldest first: their bytes and their stamps' fields,
    each in a deque of plain values. No object a read holds is one the garbage collector tracks
    (a tuple or a Stamp per read would be): a client behind its servers holds 10^4-10^5 reads,
    and collections that walked them (10-48 ms, at 256 connections with tokens 1 ms apart over
    https) delayed the read of first tokens arriving meanwhile, which the kernel then merged with
    the next token under the later stamp."""

    __slots__ = ("data", "late_ns", "more", "t_ns")

    def __init__(self) -> None:
        self.data: deque[bytes] = deque()
        self.t_ns: deque[int] = deque()
        self.late_ns: deque[int | None] = deque()
        self.more: deque[bool] = deque()

    def __len__(self) -> int:
        return len(self.data)

    def append(self, stamp: Stamp, more: bool, data: bytes) -> None:
        self.data.append(data)
        self.t_ns.append(stamp.t_ns)
        self.late_ns.append(stamp.late_ns)
        self.more.append(more)

    def popleft(self) -> tuple[Stamp, bytes]:
        return Stamp(self.t_ns.popleft(), self.late_ns.popleft(), self.more.popleft()), self.data.popleft()


class Connection:
    """One HTTP/1.1 connection on a non-blocking socket the loop watches (`loop.add_reader`):
    each read taken with `recvmsg`, stamped by the kernel (stamps.py) and held for the backlog,
    which hands it to the `reader` of the exchange in flight."""

    def __init__(self, pool: Pool, origin: Origin, sock: socket.socket, tls: TLS | None) -> None:
        self.pool, self.origin = pool, origin
        self.loop = pool.loop
        self.sock: socket.socket | None = sock
        self.tls = tls
        self.ancillary = stamps.ANCILLARY_BYTES if stamps.ask_kernel(sock) else 0
        self.held = HeldReads()
        self.held_bytes = 0
        self.paused = False
        self.unsent: deque[memoryview] = deque()  # what the socket did not take at once
        self.reader: Reader | None = None
        self.served = 0  # requests written here
        self.closed = False  # the server's EOF (or a reset) has been seen, or the client closed it
        self.last_read_ns = 0  # when the last read arrived
        self.idle_since = 0.0  # loop time of its release to the pool
        self._hangup: select.poll | None = None
        self.loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        """The loop's reader: this read, then the watch's."""
        now = self.read()
        if now:
            turns = self.pool.turns
            turns.polled(now)
            turns.watch.check(now)

    def read(self) -> int:
        """Take what the socket holds, stamped; when it was read (0: nothing was)."""
        sock = self.sock
        if sock is None:
            return 0
        try:
            data, ancdata, _, _ = sock.recvmsg(READ_BYTES, self.ancillary)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self._shut(e)
            return 0
        now = time.perf_counter_ns()
        stamp = stamps.of_read(ancdata, now, self.pool.clocks)
        self.last_read_ns = stamp.t_ns
        ended = not data
        if self.tls is not None:
            try:
                data, ended = self.tls.decrypt(data)
            except ssl.SSLError as e:
                self._shut(e)
                return 0
        if data:
            self._received(stamp, data, self.tls is not None and self.tls.incoming.pending > 0)
        if ended:
            self._eof()
        return now

    def await_first_token(self, on: bool) -> None:
        """Whether the first-token watch reads this connection ahead of the loop's turn: its
        exchange awaits its first token."""
        if self.sock is not None:
            watch = self.pool.turns.watch
            (watch.add if on else watch.discard)(self.sock.fileno(), self)

    def _received(self, stamp: Stamp, data: bytes, held_more: bool) -> None:
        if self.reader is None and not self.held:  # bytes no request asked for: not reusable
            self.close()
            return
        self.held.append(stamp, held_more, data)
        self.held_bytes += len(data)
        if len(self.held) == 1:
            self.pool.backlog.add(self)
        if self.held_bytes > HOLD_BYTES and not self.paused and self.sock is not None:
            self.paused = True
            self.loop.remove_reader(self.sock.fileno())

    def _eof(self) -> None:
        """The server ended the connection: its held reads are fed first, then the reader's eof."""
        self.release_all()
        self.closed = True
        self.pool.closed_by_server(self)
        if self.reader is not None:
            self.reader.eof()
        self._shut(None)

    def _shut(self, exc: BaseException | None) -> None:
        """Close the socket (once), and tell the pool and the reader."""
        sock = self.sock
        if sock is None:
            return
        self.pool.turns.watch.discard(sock.fileno(), self)
        self.loop.remove_reader(sock.fileno())
        if self.unsent:
            self.loop.remove_writer(sock.fileno())
            self.unsent.clear()
        if self.tls is not None and exc is None:
            with contextlib.suppress(OSError):
                sock.send(self.tls.goodbye())
        self.sock = None
        sock.close()
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
        """Hand the reader the oldest held read."""
        stamp, data = self.held.popleft()
        self.held_bytes -= len(data)
        if self.paused and self.held_bytes <= HOLD_BYTES // 2 and self.sock is not None:
            self.paused = False
            self.loop.add_reader(self.sock.fileno(), self._readable)
        if self.reader is not None:
            self.reader.feed(stamp, data)

    def write(self, data: bytes) -> None:
        self.served += 1
        if self.tls is not None:
            data = self.tls.encrypt(data)
        self._send(memoryview(data))

    def _send(self, data: memoryview) -> None:
        sock = self.sock
        if sock is None:
            return
        if not self.unsent:
            try:
                data = data[sock.send(data) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as e:
                self._shut(e)
                return
            if not data:
                _quickack(sock)
                return
            self.loop.add_writer(sock.fileno(), self._writable)
        self.unsent.append(data)

    def _writable(self) -> None:
        sock = self.sock
        while self.unsent and sock is not None:
            try:
                sent = sock.send(self.unsent[0])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._shut(e)
                return
            if sent < len(self.unsent[0]):
                self.unsent[0] = self.unsent[0][sent:]
                return
            self.unsent.popleft()
        if sock is not None:
            self.loop.remove_writer(sock.fileno())
            _quickack(sock)

    def close(self) -> None:
        self.closed = True
        self._shut(None)

    def closed_by_peer(self) -> bool:
        """Has the server closed this connection? Its EOF may wait in the socket unread: ask the
        kernel (poll for a hang-up, where there is POLLRDHUP), else peek."""
        sock = self.sock
        if self.closed or sock is None:
            return True
        if self._hangup is not None:
            return bool(self._hangup.poll(0))
        if _HANGUP:  # one poll object for the connection's life (it owns no descriptor)
            self._hangup = select.poll()
            self._hangup.register(sock.fileno(), _HANGUP)
            return bool(self._hangup.poll(0))
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False  # open, nothing pending
        except OSError:
            return True  # reset by the server


def _quickack(sock: socket.socket) -> None:
    """What the server sends next acknowledged at once, where the kernel can (the module docstring
    says why: after the request's last byte, not before)."""
    if QUICKACK is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, QUICKACK, 1)


async def open_socket(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket to the first of `host`'s addresses that answers."""
    error: OSError | None = None
    for family, kind, proto, _, addr in await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a request goes out as written
            await loop.sock_connect(sock, addr)
            return sock
        except OSError as e:
            sock.close()
            error = e
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"no address for {host}")


class Pool:
    """At most `limit` connections, opened within `connect_s`, kept for reuse."""

    def __init__(self, limit: int, connect_s: float, turns: Turns) -> None:
        self.limit, self.connect_s = limit, connect_s
        self.loop = asyncio.get_running_loop()
        self.turns = turns
        self.backlog = Backlog(self.loop, turns)
        self.clocks = stamps.WallToMonotonic()  # the kernel's stamps onto the monotonic clock
        self.stamping = stamps.KernelStamping()  # the kernel's stamping kept on while the pool lives
        self.habit = Habit()
        self.idle: dict[Origin, list[Connection]] = {}
        self.probation: set[Connection] = set()  # used, not yet proven to stay open (Habit.UNKNOWN)
        self.open = 0  # connections open or opening
        self.conns: set[Connection] = set()  # those open
        self.waiters: deque[asyncio.Future[None]] = deque()
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
        stage = "connection"
        sock: socket.socket | None = None
        try:
            await self.stamping.ready()  # (before the first connection; at once afterwards)
            async with asyncio.timeout(self.connect_s):
                sock = await open_socket(self.loop, origin.host, origin.port)
                tls = None
                if origin.tls:
                    stage = "TLS handshake"
                    tls = TLS(self._tls(), origin.host)
                    await tls.handshake(self.loop, sock)
        except TimeoutError as e:
            self._lost_one(sock)
            raise ConnectFailed(f"timeout: no {stage} within {self.connect_s:g} s (connect_s)") from e
        except (OSError, ssl.SSLError) as e:
            self._lost_one(sock)
            what = "TLS handshake failed" if stage != "connection" else "connection failed"
            raise ConnectFailed(f"{what}: {origin.host}:{origin.port}: {e}") from e
        except BaseException:
            self._lost_one(sock)
            raise
        conn = Connection(self, origin, sock, tls)
        self.conns.add(conn)
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
        conn.await_first_token(False)
        if not reusable or conn.closed or self.habit.closes_after_response:
            conn.close()  # (its end wakes a waiter)
            return
        if self.habit.state == Habit.UNKNOWN:
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
        """The connection's socket is closed."""
        self.closed_by_server(conn)
        self.conns.discard(conn)
        self._lost_one(None)

    def _lost_one(self, sock: socket.socket | None) -> None:
        """One connection fewer (`sock`: one that was opened but never became a Connection)."""
        if sock is not None:
            sock.close()
        self.open -= 1
        self._wake()

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
        """Close every connection (a request still in flight on one fails as lost)."""
        self.stamping.close()
        self.idle.clear()
        self.probation.clear()
        for conn in list(self.conns):
            conn.close()
        self.turns.watch.close()
