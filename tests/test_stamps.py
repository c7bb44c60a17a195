"""First-token times stamped by the kernel: the arrival of the bytes, not the moment a busy client
got to them; user-space stamps where the kernel gives none, and said so."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import select
import socket
import ssl
import struct
import termios
import threading
import time
from pathlib import Path

import pytest

from harness.config.scenario import Timeouts
from harness.core import aio
from harness.wire import stamps
from harness.wire.client import Exchange, StreamingClient
from harness.wire.connection import Origin, Pool
from harness.wire.turns import WATCH_NS, Turns
from tests.conftest import arm_folders, kvbench, write_scenario
from tests.servers import requests_on

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(obj: bytes) -> bytes:
    payload = b"data: " + obj + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(payload), payload)


ROLE = event(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
TOKEN = event(b'{"choices":[{"index":0,"delta":{"content":" tok"}}]}')
DONE = event(b"[DONE]") + b"0\r\n\r\n"


class SendOnCue:
    """Answers one request with its head and role chunk at once, then, when `go` is set, stamps
    `sent_ns` (the monotonic clock the client uses) and writes every token in one burst. With
    `tls`, over TLS with that server context."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http{'s' if tls else ''}://127.0.0.1:{self.sock.getsockname()[1]}/v1/chat/completions"
        self.answered, self.go, self.sent = threading.Event(), threading.Event(), threading.Event()
        self.sent_ns = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        if self.tls is not None:
            conn = self.tls.wrap_socket(conn, server_side=True)
        with conn, contextlib.suppress(OSError):
            for _ in requests_on(conn):
                conn.sendall(HEAD + ROLE)
                self.answered.set()
                self.go.wait(30)
                self.sent_ns = time.perf_counter_ns()
                conn.sendall(TOKEN * 64 + DONE)
                self.sent.set()
                conn.recv(1)  # until the client closes

    def close(self) -> None:
        self.go.set()
        self.sock.close()


def busy_while_sent(server: SendOnCue) -> tuple[Exchange, int]:
    """One request; once its head is in, the loop is held until the server has sent every token,
    and 50 ms more. Returns the exchange and when the loop was free again."""

    async def main() -> tuple[Exchange, int]:
        async with StreamingClient(2, Timeouts(first_token_s=30, idle_s=30, total_s=60), {}) as client:
            task = asyncio.ensure_future(client.stream(server.url, b"{}", "r1"))
            while not server.answered.is_set():
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # the head and role chunk read and parsed
            server.go.set()
            assert server.sent.wait(30)  # the loop is held: nothing is read while the tokens arrive
            time.sleep(0.05)
            free = time.perf_counter_ns()
            return await task, free

    return aio.run(main())


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_busy_loop_does_not_move_the_first_token_stamp(scheme: str, tmp_path: Path) -> None:
    """The loop is blocked while the server sends the tokens: the first token's stamp lies between
    the server's send and the end of the block (a user-space stamp would come after it), comes from
    the kernel, and the lateness recorded with it reaches past the block. Over TLS the same: the
    stamp of the raw read that completed the token's record."""
    ctx = None
    if scheme == "https":
        import trustme

        ca = trustme.CA()
        ca_file = tmp_path / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ca.issue_cert("127.0.0.1").configure_cert(ctx)
    server = SendOnCue(ctx)
    with pytest.MonkeyPatch.context() as env:
        if scheme == "https":
            env.setenv("SSL_CERT_FILE", str(ca_file))
        try:
            ex, free = busy_while_sent(server)
        finally:
            server.close()
    assert ex.ok, ex.error
    first = ex.state.first_token_ns
    assert first is not None and ex.first_token_late_ns is not None
    assert ex.first_token_stamp == "kernel"
    assert server.sent_ns <= first < free <= first + ex.first_token_late_ns
    assert ex.first_token_shared == 63  # the burst came in the first token's read


def test_kernel_stamps_move_onto_the_monotonic_clock_by_the_clocks_offset() -> None:
    """A read's control message gives the kernel's wall-clock stamp; it becomes a monotonic one by
    the clocks' offset; a stamp that would fall after the read (the offset's own uncertainty) is
    the read's; no control message, a user-space stamp. The offset is measured when first asked
    for, and again only once it is REFRESH_NS old."""
    wall_now, mono_now = 1_700_000_000_000_000_000, 5_000_000_000
    offset = wall_now - mono_now
    got = stamps.from_kernel(wall_now - 2_000_000, mono_now, offset)
    assert got == stamps.Stamp(mono_now - 2_000_000, 2_000_000) and got.source == "kernel"
    assert stamps.from_kernel(wall_now + 30, mono_now, offset) == stamps.Stamp(mono_now, 0)
    clocks = stamps.WallToMonotonic()
    assert stamps.of_read([], mono_now, clocks) == stamps.Stamp(mono_now) and stamps.Stamp(mono_now).source == "user"
    now = time.perf_counter_ns()
    clocks.at(now)  # (whether its offset is right, the busy-loop tests check by ordering)
    assert clocks.taken_ns >= now
    clocks.offset_ns = 12345  # not measured again until REFRESH_NS after it was taken
    assert clocks.at(clocks.taken_ns + stamps.REFRESH_NS - 1) == 12345
    assert clocks.at(clocks.taken_ns + stamps.REFRESH_NS) != 12345
    if stamps.TIMESTAMPNS is not None:
        before = time.time_ns() - 1_000_000
        message = (socket.SOL_SOCKET, stamps.TIMESTAMPNS, struct.pack("@ll", *divmod(before, 1_000_000_000)))
        read = stamps.of_read([message], time.perf_counter_ns(), stamps.WallToMonotonic())
        assert read.source == "kernel" and read.late_ns is not None and read.late_ns >= 1_000_000
        assert read.t_ns + read.late_ns <= time.perf_counter_ns()


def answered_at_once() -> bool:
    """Whether a byte sent on a loopback connection the moment it opened, and read at once, came
    with the kernel's stamp (the connection asks for stamps, as a pool's do)."""
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()) as receiver,
    ):
        sender, _ = listener.accept()
        with sender:
            assert stamps.ask_kernel(receiver)
            sender.sendall(b"x")
            return bool(receiver.recvmsg(1, stamps.ANCILLARY_BYTES)[1])


@pytest.mark.skipif(stamps.TIMESTAMPNS is None, reason="the kernel's receive stamps are Linux's")
def test_the_kernel_stamps_from_a_pools_first_connection_to_its_last() -> None:
    """Linux turns its stamping on from a work queue some time after the first socket asks, and
    off after the last one closes: a connection answered at once, alone, often reads unstamped.
    While a pool's KernelStamping is held and ready, every such connection gets the kernel's
    stamp, each closed 10 ms before the next opens (without it, 8 to 10 of 20 read unstamped
    here); concurrent first connections wait for one answer."""

    async def main() -> list[bool]:
        stamping = stamps.KernelStamping()
        try:
            assert await asyncio.gather(*(stamping.ready() for _ in range(3))) == [True] * 3
            answers = []
            for _ in range(20):
                answers.append(answered_at_once())
                await asyncio.sleep(0.01)  # long enough, alone, for the kernel to stop stamping
            return answers
        finally:
            stamping.close()

    assert aio.run(main()) == [True] * 20


class Feeds:
    """A connection's reader that keeps what it is fed."""

    def __init__(self) -> None:
        self.reads: list[tuple[stamps.Stamp, bytes]] = []

    def feed(self, stamp: stamps.Stamp, data: bytes) -> None:
        self.reads.append((stamp, data))

    def eof(self) -> None:
        pass

    def lost(self, exc: BaseException | None) -> None:
        pass


def queued(sock: socket.socket, n: int) -> None:
    """Wait until the kernel holds `n` unread bytes for `sock` (the loop is not given a turn)."""
    deadline = time.perf_counter() + 10
    while fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0") != struct.pack("i", n):
        assert time.perf_counter() < deadline, f"{n} bytes never arrived"
        select.select([sock], [], [], 0.01)


@pytest.mark.skipif(stamps.TIMESTAMPNS is None or not hasattr(select, "epoll"), reason="Linux's stamps and epoll")
@pytest.mark.parametrize("watched", [True, False])
def test_the_watch_reads_a_first_token_before_the_next_token_can_merge_with_it(watched: bool) -> None:
    """Linux merges a socket's queued segments, and a read takes the newest one's stamp. A
    connection awaiting its first token is read whenever its client's watch is asked (between the
    loop's other reads and its parsing), before the loop's own turn comes: its first token is read
    alone with its own stamp, and the token after it in a read of its own, stamped later.
    Unwatched, the loop reads both in one read, stamped as the second. The watch is asked at most
    every WATCH_NS."""

    async def main() -> list[tuple[stamps.Stamp, bytes]]:
        pool = Pool(1, 5.0, Turns())
        with socket.create_server(("127.0.0.1", 0)) as listener:
            conn = await pool.acquire(Origin(False, "127.0.0.1", listener.getsockname()[1]))
            server, _ = listener.accept()
        feeds = Feeds()
        conn.reader = feeds
        assert conn.sock is not None
        with server:
            conn.await_first_token(watched)
            asked = time.perf_counter_ns()
            pool.turns.watch.check(asked)
            server.sendall(b"first")
            queued(conn.sock, 5)
            pool.turns.watch.check(asked + WATCH_NS - 1)  # asked too soon after the last time: not read
            queued(conn.sock, 5)
            pool.turns.watch.check(asked + WATCH_NS)
            server.sendall(b"second")
            queued(conn.sock, 6 if watched else 11)
            while sum(len(data) for _, data in feeds.reads) < 11:
                await asyncio.sleep(0)
            conn.await_first_token(False)
            await pool.close()
        return feeds.reads

    reads = aio.run(main())
    assert [data for _, data in reads] == ([b"first", b"second"] if watched else [b"firstsecond"])
    assert all(stamp.source == "kernel" for stamp, _ in reads)
    assert reads[0][0].t_ns < reads[-1][0].t_ns or not watched


SCENARIO = """
name = "stamps"
[endpoint]
max_tokens = 16
transport = "{transport}"
[metrics]
enabled = false
[workload]
kind = "closed_loop"
requests = 12
concurrency = 4
pool = 2
prompt_tokens = 500
[emulator]
time_scale = 20.0
"""


@pytest.mark.parametrize("transport", ["kvbench", "aiohttp"])
def test_each_record_says_where_its_first_token_stamp_came_from(transport: str, tmp_path: Path) -> None:
    """kvbench's own transport: every first token stamped by the kernel, with its lateness; the
    aiohttp escape hatch: in user space. run.json counts both sources and client_health gives the
    lateness."""
    sc = write_scenario(tmp_path / "s.toml", SCENARIO.format(transport=transport))
    r = kvbench("run", str(sc), "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "o", "stamps").values()
    meta = json.loads((folder / "run.json").read_text())
    records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]
    assert len(records) == 12
    late = meta["client_health"]["lateness"]["late_ms"]
    if transport == "kvbench":
        assert {r["first_token_stamp"] for r in records} == {"kernel"}
        assert all(r["first_token_late_s"] >= 0 for r in records)
        assert meta["first_token_stamps"]["kernel"] == 12 and meta["first_token_stamps"]["user"] == 0
        assert 0 <= late["p50"] <= late["p99"] <= late["max"]
    else:
        assert {r["first_token_stamp"] for r in records} == {"user"}
        assert not any("first_token_late_s" in r for r in records)
        assert meta["first_token_stamps"]["kernel"] == 0 and meta["first_token_stamps"]["user"] == 12
        assert late["p50"] is None
