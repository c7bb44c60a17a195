"""The client's timestamps: bytes stamped as they arrive, parsing shared out in turns."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import random
import re
import resource
import socket
import threading
import time
from pathlib import Path

import pytest

from harness.config.scenario import Timeouts
from harness.core import aio
from harness.core.errors import EndpointError
from harness.server import endpoint
from harness.wire.client import OTHER_FILES, Exchange, StreamingClient, reserve_descriptors
from harness.wire.connection import Habit
from harness.wire.sse import SSEDecoder, SSEEvent, SSELimitError
from harness.wire.turns import DUE, SEND_HOLD_NS, SEND_MARGIN_NS, SLICE_NS, Turns
from tests.servers import ThreadedServer, requests_on

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(obj: bytes) -> bytes:
    return chunk(b"data: " + obj + b"\n\n")


ROLE = event(b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
TOKEN = event(b'{"choices":[{"index":0,"delta":{"content":" tok"}}]}')
DONE = event(b"[DONE]") + b"0\r\n\r\n"


class HeldBackServer:
    """Answers each streaming request with its headers and role chunk at once, then waits for
    `go`; then sends each connection its tokens, one connection after the other in the order
    given, as fast as the sockets take them."""

    def __init__(self, tokens: dict[str, int]) -> None:
        self.tokens = tokens  # request id -> tokens to send
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1/chat/completions"
        self.answered = threading.Semaphore(0)
        self.go = threading.Event()
        self.sent = threading.Event()
        self.threads = [threading.Thread(target=self._serve, daemon=True) for _ in tokens]
        for t in self.threads:
            t.start()
        self._next: str | None = next(iter(tokens))
        self._order = threading.Condition()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        # The client does not read while the test holds its loop: the burst must fit in the
        # socket buffers, or sendall would wait for a reader that waits for it.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        with conn:
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += conn.recv(65536)
            head, _, body = raw.partition(b"\r\n\r\n")
            headers = dict(line.decode().lower().split(": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
            while len(body) < int(headers["content-length"]):
                body += conn.recv(65536)
            conn.sendall(HEAD + ROLE)
            self.answered.release()
            rid = headers["x-request-id"]
            self.go.wait(30)
            with self._order:  # in the order of `tokens`
                while self._next != rid:
                    self._order.wait(30)
                conn.sendall(TOKEN * self.tokens[rid] + DONE)
                ids = list(self.tokens)
                self._next = ids[ids.index(rid) + 1] if rid != ids[-1] else None
                if self._next is None:
                    self.sent.set()
                self._order.notify_all()
            conn.recv(1)  # until the client closes

    def close(self) -> None:
        self.go.set()
        self.sock.close()


def test_bytes_are_stamped_as_they_arrive_not_when_read_or_parsed() -> None:
    """A 1,500-token burst (100 KB) on one connection, then a single token on another, arrive
    while the client's loop is held: both first tokens are stamped before the loop was free again
    (their arrival, by the kernel), in the order the server sent them, and the small stream's
    stamp does not wait for the burst's parsing. By ordering only; the error itself is measured by
    bench/ttft_accuracy.py."""
    server = HeldBackServer({"big": 1500, "small": 1})

    async def main() -> tuple[Exchange, Exchange, int]:
        client = StreamingClient(4, Timeouts(), {})
        try:
            big = asyncio.ensure_future(client.stream(server.url, b"{}", "big"))
            small = asyncio.ensure_future(client.stream(server.url, b"{}", "small"))
            for _ in range(2):
                while not server.answered.acquire(blocking=False):
                    await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # both responses' headers read and parsed
            server.go.set()
            assert server.sent.wait(30)
            time.sleep(0.05)  # the loop is held while the bytes arrive
            free = time.perf_counter_ns()
            return await big, await small, free
        finally:
            await client.close()

    try:
        big, small, free = aio.run(main())
    finally:
        server.close()
    assert big.ok and small.ok, (big.error, small.error)
    assert len(big.state.token_chunk_ns) == 1500 and len(small.state.token_chunk_ns) == 1
    assert big.state.first_token_ns is not None and small.state.first_token_ns is not None
    assert big.state.first_token_ns <= small.state.first_token_ns < free < big.end_ns
    assert big.first_token_stamp == small.first_token_stamp == "kernel"


def test_parsing_turns_let_the_loop_poll_and_every_stream_finishes() -> None:
    """Three streams with 40 ms of parsing each: the loop still turns at least every few slices
    (a ticker counts its turns), a stream cancelled while it waits for its turn holds no one up,
    and the others finish."""
    budget = Turns()  # a client's: its streams share it

    async def parse(items: int, per_item_s: float) -> int:
        done = 0
        for _ in range(items):
            if budget.spent():
                await budget.wait()
            end = time.perf_counter() + per_item_s
            while time.perf_counter() < end:
                pass
            done += 1
        return done

    async def main() -> tuple[list[int], int, bool]:
        turns = 0
        stop = False

        async def ticker() -> None:
            nonlocal turns
            while not stop:
                await asyncio.sleep(0)
                turns += 1

        tick = asyncio.ensure_future(ticker())
        victim = asyncio.ensure_future(parse(400, 0.0001))
        streams = [asyncio.ensure_future(parse(400, 0.0001)) for _ in range(3)]
        await asyncio.sleep(0.01)
        victim.cancel()
        done = await asyncio.gather(*streams)
        stop = True
        await tick
        return done, turns, victim.cancelled()

    done, turns, cancelled = aio.run(main())
    assert done == [400, 400, 400] and cancelled
    work_ns = 3 * 400 * 100_000
    assert turns >= work_ns / SLICE_NS / 4, turns  # ~one turn per slice; one per stream burst without turns


def test_a_timed_send_holds_parsing_back_until_it_is_written() -> None:
    """From SEND_MARGIN_NS before a timed send's time, parsing gives the loop back; once the send
    is written it goes on; a send that never is holds it back for SEND_HOLD_NS at most."""
    turns = Turns()

    def sender(due: int, written: bool) -> None:
        turns.expect(due)
        if written:
            turns.written()
            turns.written()  # once is enough; again (a retry, the task's own end) changes nothing

    contextvars.copy_context().run(sender, 10_000_000, False)
    assert not turns.send_near(10_000_000 - SEND_MARGIN_NS - 1)
    assert turns.send_near(10_000_000 - SEND_MARGIN_NS)
    assert turns.send_near(10_000_000 + SEND_HOLD_NS)  # overdue, not yet written
    assert not turns.send_near(10_000_000 + SEND_HOLD_NS + 1)  # stuck: parsing goes on
    contextvars.copy_context().run(sender, 20_000_000, True)
    assert not turns.send_near(20_000_000)
    assert DUE.get() is None  # the senders' own contexts held their times


def test_an_open_loop_can_open_its_connections_ahead() -> None:
    """`open_idle` opens connections without sending on them; the requests that follow take them
    (no new connection, each a first request on its connection); none for a server that closes
    each connection after its response."""
    server = OneAnswerServer(HEAD + ROLE + TOKEN + DONE, close=False)

    async def main() -> tuple[int, list[Exchange], int]:
        async with StreamingClient(8, Timeouts(), {}) as client:
            opened = await client.open_idle(server.url, 5)
            for _ in range(500):  # the server's thread accepts them in its own time
                if server.accepted >= 5:
                    break
                await asyncio.sleep(0.01)
            accepted = server.accepted
            exs = await asyncio.gather(*(client.stream(server.url, b"{}", f"r{k}") for k in range(5)))
            client.backend.pool.habit.state = Habit.CLOSES  # type: ignore[attr-defined]
            assert await client.open_idle(server.url, 5) == 0
            return opened, exs, accepted

    try:
        opened, exs, accepted = aio.run(main())
    finally:
        server.close()
    assert opened == 5 and accepted == 5
    assert all(ex.ok and ex.written and not ex.reused for ex in exs), [ex.error for ex in exs]
    assert server.accepted == 5


def test_descriptors_are_reserved_for_the_connections() -> None:
    """The descriptor table is grown before the clock for as many connections as asked (and the
    soft limit of open files raised for them when the hard one allows)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 3000 + OTHER_FILES
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard limit of open files ({hard}) is below {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))
    try:
        reserve_descriptors(3000)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= want
        status = Path("/proc/self/status").read_text().splitlines()
        fd_size = int(next(line.split()[1] for line in status if line.startswith("FDSize:")))
        assert fd_size >= want
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


GOLDEN = Path(__file__).parent / "golden"


class OneAnswerServer(ThreadedServer):
    """Answers every request with the same bytes, then closes the connection (`close`) or reads
    the next request on it."""

    def __init__(self, answer: bytes, close: bool) -> None:
        self.answer, self.close_after = answer, close
        super().__init__()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            for _ in requests_on(conn):
                conn.sendall(self.answer)
                if self.close_after:
                    return


def framed(sse: bytes, how: str, rng: random.Random) -> tuple[bytes, bool]:
    """An SSE body as a response: (bytes, whether the connection closes after it)."""
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    if how == "length":
        return ok + b"Content-Length: %d\r\n\r\n%s" % (len(sse), sse), False
    if how == "close":
        return ok + b"Connection: close\r\n\r\n" + sse, True
    if how == "event":  # one chunk per event, as engines send them
        pieces = [e + b"\n\n" for e in sse.split(b"\n\n") if e] if sse.endswith(b"\n\n") else [sse]
    else:  # chunks cut anywhere, some with an extension
        cuts = sorted(rng.sample(range(1, len(sse)), min(8, len(sse) - 1)))
        pieces = [sse[a:b] for a, b in zip([0, *cuts], [*cuts, len(sse)], strict=True)]
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), b";x=1" if rng.random() < 0.3 else b"", p) for p in pieces)
    return ok + b"Transfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n", False


ANSWERS = {
    "http-500": (b'HTTP/1.1 500 Oops\r\nContent-Length: 17\r\n\r\n{"error":"boom"}\n', False),
    "cut-mid-body": (HEAD + TOKEN + b"40\r\ndata: ", True),
    "bad-chunk-size": (HEAD + TOKEN + b"zz\r\n", False),
    "no-token": (HEAD + ROLE + DONE, False),
    "no-done": (HEAD + ROLE + TOKEN + b"0\r\n\r\n", False),
}


def seen(ex: Exchange) -> tuple[object, ...]:
    """What an exchange says, apart from its times and the wording of transport errors."""
    s = ex.state
    return (
        ex.ok,
        ex.error_kind,
        ex.http_status,
        ex.error if ex.error_kind in (None, "http", "empty") or (ex.error or "").startswith("error in stream") else "",
        len(s.token_chunk_ns),
        (s.prompt_tokens, s.completion_tokens, s.cached_tokens, s.finish_reason, s.done),
        "".join(s.answer or ()),
    )


@pytest.mark.parametrize(
    "case",
    [f"{p.name}:{how}" for p in sorted(GOLDEN.glob("*.sse")) for how in ("event", "anywhere", "length", "close")]
    + list(ANSWERS),
)
def test_kvbench_transport_says_what_aiohttp_says(case: str) -> None:
    """kvbench's own transport and aiohttp's client give the same exchanges: golden transcripts
    framed four ways, and failures."""
    name, _, how = case.partition(":")
    answer, close = framed((GOLDEN / name).read_bytes(), how, random.Random(name)) if how else ANSWERS[name]
    server = OneAnswerServer(answer, close)

    async def go(transport: str) -> list[tuple[object, ...]]:
        timeouts = Timeouts(first_token_s=10, idle_s=10, total_s=10)
        async with StreamingClient(2, timeouts, {}, transport=transport) as client:  # type: ignore[arg-type]
            return [seen(await client.stream(server.url, b"{}", f"r{i}", answer=[])) for i in range(3)]

    try:
        own, via_aiohttp = aio.run(go("kvbench")), aio.run(go("aiohttp"))
    finally:
        server.close()
    assert own == via_aiohttp
    assert len(set(own)) == 1  # the connection's reuse (or not) changes nothing


class ScriptServer(ThreadedServer):
    """Answers each request with steps of (pause in seconds, bytes), each connection in a thread."""

    def __init__(self, steps: list[tuple[float, bytes]]) -> None:
        self.steps = steps
        super().__init__()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            raw = b""
            while b"\r\n\r\n" not in raw:
                raw += conn.recv(65536)
            for pause, data in self.steps:
                time.sleep(pause)
                conn.sendall(data)
            conn.recv(1)


COMMENT = chunk(b": keep-alive\n\n")
SCRIPTS = {  # first_token_s 0.3, idle_s 0.2, total_s 0.8
    "quiet": ([(0, HEAD + ROLE), (1.0, TOKEN)], "timeout: no data for 0.2 s (idle_s)"),
    "late-first-token": (
        [(0, HEAD + ROLE), *[(0.1, COMMENT)] * 6, (0, TOKEN)],
        "timeout: no first token within 0.3 s (first_token_s)",
    ),
    "too-long": (
        [(0, HEAD + ROLE + TOKEN), *[(0.1, TOKEN)] * 12],
        "timeout: stream not finished within 0.8 s (total_s)",
    ),
    "in-time": ([(0, HEAD + ROLE), (0.15, TOKEN), *[(0.15, TOKEN)] * 2, (0, DONE)], None),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
@pytest.mark.parametrize("transport", ["kvbench", "aiohttp"])
def test_each_timeout_names_its_limit(name: str, transport: str) -> None:
    """idle_s, first_token_s and total_s, each reached alone, on either path; a stream whose first
    token is in time may go on past first_token_s. Whatever ended it, its connection is no longer
    watched for a first token."""
    steps, error = SCRIPTS[name]
    server = ScriptServer(steps)

    async def go() -> tuple[Exchange, int]:
        timeouts = Timeouts(first_token_s=0.3, idle_s=0.2, total_s=0.8)
        async with StreamingClient(1, timeouts, {}, transport=transport) as client:  # type: ignore[arg-type]
            ex = await client.stream(server.url, b"{}", "r")
            return ex, len(client.turns.watch.conns)

    try:
        ex, watched = aio.run(go())
    finally:
        server.close()
    assert ex.error == error
    assert ex.ok or ex.error_kind == "timeout"
    assert watched == 0


@pytest.mark.parametrize(
    "steps",
    [
        [(0.05, bytes([b])) for b in HEAD],  # the status line and headers a byte at a time
        [(0, b"HTTP/1.1 200 OK\r\n"), *[(0.05, b"X-Slow: 1\r\n")] * 128],  # 128 header lines, slowly
    ],
    ids=["byte-by-byte", "line-by-line"],
)
def test_a_head_that_trickles_is_given_up_within_connect_s_of_its_first_byte(steps: list[tuple[float, bytes]]) -> None:
    """A server that sends its head slowly, each byte or line well within idle_s of the last:
    the request fails as a timeout naming connect_s, before the head is whole (it held each
    request for first_token_s, 900 s by default; issue 56 item 5)."""
    server = ScriptServer(steps)

    async def go() -> Exchange:
        timeouts = Timeouts(connect_s=0.3, first_token_s=60, idle_s=30, total_s=120)
        async with StreamingClient(1, timeouts, {}) as client:
            return await client.stream(server.url, b"{}", "r")

    try:
        ex = aio.run(go())
    finally:
        server.close()
    assert ex.error_kind == "timeout" and ex.http_status is None, ex.error
    assert ex.error == "timeout: the response's head was not whole 0.3 s after its first byte (connect_s)"


def test_a_stalled_tls_handshake_on_the_control_plane_is_named_within_connect_s() -> None:
    """A server that accepts the connection and never answers the TLS handshake: the model list
    (the control plane) fails within connect_s, naming the handshake; a call's own total no
    longer replaces the session's connect bound (it waited 30 s: issue 56 item 5)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    base = f"https://127.0.0.1:{listener.getsockname()[1]}/v1"

    async def go() -> str:
        async with StreamingClient(1, Timeouts(connect_s=0.5), {}) as client:
            with pytest.raises(EndpointError) as e:
                await endpoint.list_models(client.session, base, {})
            return str(e.value)

    try:
        said = aio.run(go())
    finally:
        listener.close()
        for c in held:
            c.close()
    assert said.endswith("no connection or TLS handshake within 0.5 s (connect_s)"), said


# --- hostile servers on the wire (issue 30, cases 1-3 and 5; issue 29's strict framing) ---------


def test_an_endless_event_of_empty_data_lines_is_bounded() -> None:
    """Empty `data:` lines count toward an event's size (a byte each, for the line's end): an
    event made of them ends at max_line_bytes, and each read adds only its own lines."""
    decoder = SSEDecoder(max_line_bytes=1000)
    with pytest.raises(SSELimitError, match="event"):
        for _ in range(1000):
            decoder.feed(b"data:\n" * 10)
    decoder = SSEDecoder(max_line_bytes=1000)
    assert decoder.feed(b"data:\n" * 900 + b"\n") == [SSEEvent(b"\n" * 899)]


class FloodServer(ThreadedServer):
    """Answers every request on a connection with HEAD + ROLE, then `body` for ever (until the
    client closes), or `answer` once when given."""

    def __init__(self, body: bytes, answer: bytes | None = None) -> None:
        self.body, self.answer = body, answer
        super().__init__()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            for _ in requests_on(conn):
                if self.answer is not None:
                    conn.sendall(self.answer)
                    continue
                conn.sendall(HEAD + ROLE)
                while True:
                    conn.sendall(self.body * 64)


def stream_once(url: str, max_tokens: int = 0, transport: str = "kvbench", n: int = 1) -> list[Exchange]:
    async def go() -> list[Exchange]:
        timeouts = Timeouts(first_token_s=30, idle_s=30, total_s=60)
        async with StreamingClient(1, timeouts, {}, transport=transport) as client:  # type: ignore[arg-type]
            return [await client.stream(url, b"{}", f"r{i}", max_tokens=max_tokens) for i in range(n)]

    return aio.run(go())


@pytest.mark.parametrize("transport", ["kvbench", "aiohttp"])
def test_a_token_flood_past_max_tokens_fails_as_too_long(transport: str) -> None:
    """A server that never stops sending tokens: the request fails once the response carries more
    than twice its max_tokens and 64 more (client.token_limit), whatever the total timeout."""
    server = FloodServer(TOKEN)
    try:
        (ex,) = stream_once(server.url, max_tokens=16, transport=transport)
    finally:
        server.close()
    assert ex.error_kind == "too_long" and "max_response_tokens" in (ex.error or "")
    assert 2 * 16 + 64 < len(ex.state.token_chunk_ns) <= 2 * 16 + 64 + 64 * 64  # (a read's worth beyond)


@pytest.mark.parametrize(
    "answer",
    [
        "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\nab".encode(),
        "HTTP/1.1 \u00b200 OK\r\nContent-Length: 2\r\n\r\nab".encode(),
        b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nContent-Length: 4\r\n\r\ndata: [DONE]\n\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n" + TOKEN + DONE,
        b"HTTP/1.1 200 OK\r\nX-Evil: a\x00b\r\n" + HEAD.split(b"\r\n", 1)[1] + TOKEN + DONE,
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n" + HEAD + TOKEN + DONE,
    ],
    ids=["unicode-length", "unicode-status", "huge-length", "two-lengths", "length+chunked", "nul", "101"],
)
def test_broken_framing_is_a_protocol_error_never_a_success(answer: bytes) -> None:
    """What llhttp refuses fails each request as `protocol`, at once, also when the server keeps
    the connection open for the next one."""
    server = FloodServer(b"", answer)
    try:
        got = stream_once(server.url, n=2)
    finally:
        server.close()
    assert [ex.error_kind for ex in got] == ["protocol", "protocol"], [ex.error for ex in got]


SSE_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'
SSE_DONE = b"data: [DONE]\n\n"
WHOLE = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(SSE_TOKEN + SSE_DONE), SSE_TOKEN + SSE_DONE)


@pytest.mark.parametrize(
    "answer",
    [
        # a whole answer whose declared length ends after [DONE]
        WHOLE,
        # one whose declared length ends before it (the rest would be "a body longer than declared")
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(SSE_TOKEN), SSE_TOKEN + SSE_DONE),
        # bodyless responses (RFC 9110: no body whatever the headers say)
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 40\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    ],
    ids=["whole", "cut", "204", "304", "empty"],
)
@pytest.mark.parametrize("after", [b"X", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"], ids=["byte", "answer"])
def test_bytes_after_a_responses_end_change_nothing_of_its_outcome(answer: bytes, after: bytes) -> None:
    """Bytes after a response's declared end, in the same read, are no request's (a stray answer, or
    a body longer than declared): each request ends as it would without them, at once, and not
    on a wrong answer (a busy client reads a stray answer together with the real one, where an
    idle one reads it apart: the outcome must not depend on how the reads were cut)."""
    outcomes = []
    for sent in (answer, answer + after):
        server = FloodServer(b"", sent)
        try:
            got = stream_once(server.url, n=2)
        finally:
            server.close()
        outcomes.append([(ex.error_kind, len(ex.state.token_chunk_ns)) for ex in got])
    assert outcomes[0] == outcomes[1]
    if answer == WHOLE:
        assert outcomes[0] == [(None, 1), (None, 1)]


@pytest.mark.parametrize(
    "chunk",
    [
        b'{"error":' + b"[" * 990 + b"]" * 990 + b"}",
        b'{"choices":[{"index":0,"delta":{},"finish_reason":' + b"[" * 990 + b"]" * 990 + b"}]}",
    ],
    ids=["deep-error", "deep-finish-reason"],
)
@pytest.mark.parametrize("transport", ["kvbench", "aiohttp"])
def test_deeply_nested_json_from_the_server_fails_its_request_only(chunk: bytes, transport: str) -> None:
    """An error or a finish reason nested 990 deep (within orjson's own limit): reading it fails
    that request at once (`protocol`), never the event loop or the run (the aiohttp escape hatch
    too: it raised out of the client and ended the run), and the next request on a new
    connection is answered as usual."""
    server = FloodServer(b"", HEAD + ROLE + TOKEN + event(chunk) + DONE)
    try:
        got = stream_once(server.url, n=2, transport=transport)
    finally:
        server.close()
    assert [ex.error_kind for ex in got] == ["protocol", "protocol"], [ex.error for ex in got]
    assert all("RecursionError" in (ex.error or "") for ex in got)


@pytest.mark.parametrize("transport", ["kvbench", "aiohttp"])
@pytest.mark.parametrize("where", ["http-body", "error-event"])
def test_a_key_echoed_across_the_cut_of_an_error_text_leaves_nothing_of_itself(transport: str, where: str) -> None:
    """A server echoes the API key where an error text is cut (an HTTP error's body at 1,000
    characters, an error event's at 500 before): the key is taken out first, then the text is cut
    (at 1,000 characters, the whole message), so none of its characters are left."""
    key = "sk-" + "k" * 37
    pad = "x" * (1000 - len("HTTP 401: ") - 19)  # the key starts 19 characters before the cut
    if where == "http-body":
        body = (pad + key).encode()
        answer = b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    else:
        pad = "x" * (500 - 19)  # where an error event's text was cut before
        answer = HEAD + ROLE + event(b'{"error":"' + (pad + key).encode() + b'"}') + DONE
    server = FloodServer(b"", answer)

    async def go() -> Exchange:
        timeouts = Timeouts(first_token_s=30, idle_s=30, total_s=60)
        headers = {"Authorization": f"Bearer {key}"}
        async with StreamingClient(1, timeouts, headers, transport=transport) as client:  # type: ignore[arg-type]
            return await client.stream(server.url, b"{}", "r1")

    try:
        ex = aio.run(go())
    finally:
        server.close()
    assert ex.error is not None and "sk-" not in ex.error and "kkk" not in ex.error, (ex.error or "")[-60:]
    assert len(ex.error) <= 1000


class StrayAnswerServer(ThreadedServer):
    """Answers each request with its own X-Request-Id as the one token (Content-Length framing,
    the connection kept alive), then, 5 ms later, with a second whole answer no request asked for."""

    @staticmethod
    def answer(text: bytes) -> bytes:
        body = b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\ndata: [DONE]\n\n' % text
        return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n%s" % (
            len(body),
            body,
        )

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            for head, _ in requests_on(conn):
                rid = re.search(rb"(?i)\r\nx-request-id: *(\S+)", head)
                conn.sendall(self.answer(rid.group(1) if rid else b"?"))
                time.sleep(0.005)
                conn.sendall(self.answer(b"stray"))


@pytest.mark.parametrize("transport", ["kvbench", "aiohttp"])
def test_an_answer_no_request_asked_for_is_never_the_next_requests(transport: str) -> None:
    """A server that sends a second answer after each real one, on a kept-alive connection: every
    request's recorded answer is its own (through aiohttp, 12 of 20 were another's: it read the
    stray answer as the next request's), whichever transport sends."""
    server = StrayAnswerServer()

    async def go() -> list[tuple[str, str, str | None]]:
        timeouts = Timeouts(first_token_s=10, idle_s=10, total_s=20)
        out = []
        async with StreamingClient(1, timeouts, {}, transport=transport) as client:  # type: ignore[arg-type]
            for i in range(20):
                answer: list[str] = []
                ex = await client.stream(server.url, b"{}", f"r{i}", answer=answer)
                out.append((f"r{i}", "".join(answer), ex.error_kind))
                await asyncio.sleep(0.01)  # the stray answer comes in while the connection is idle
        return out

    try:
        got = aio.run(go())
    finally:
        server.close()
    assert [answer for rid, answer, _ in got if answer != rid] == []
    assert [kind for _, _, kind in got] == [None] * 20


def test_a_compressed_stream_is_refused_by_name() -> None:
    """kvbench asks for no encoding (Accept-Encoding: identity); a server that compresses the
    stream anyway fails the request at once as `protocol`, naming the encoding, instead of
    "stream ended before [DONE]"."""
    import gzip

    body = gzip.compress(b"data: " + TOKEN + b"\n\ndata: [DONE]\n\n")
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    server = FloodServer(b"", answer)
    try:
        (ex,) = stream_once(server.url)
    finally:
        server.close()
    assert ex.error_kind == "protocol" and "Content-Encoding: gzip" in (ex.error or ""), ex.error


def test_a_count_of_the_wrong_type_is_not_taken() -> None:
    """A usage chunk whose counts are a bool, a negative number or a string: none of them is
    written into the record (a reader would refuse the record, and the run would say 0 requests)."""
    usage = b'{"choices":[],"usage":{"prompt_tokens":true,"completion_tokens":-3,'
    usage += b'"prompt_tokens_details":{"cached_tokens":"12"}}}'
    server = FloodServer(b"", HEAD + ROLE + TOKEN + event(usage) + DONE)
    try:
        (ex,) = stream_once(server.url)
    finally:
        server.close()
    assert ex.ok, ex.error
    state = ex.state
    assert (state.prompt_tokens, state.completion_tokens, state.cached_tokens) == (None, None, None)


class ClosesReusedServer(ThreadedServer):
    """Answers a connection's first request; a later request on the same connection it reads,
    then closes the connection 10 ms later without answering (a half-close racing keep-alive)."""

    def __init__(self) -> None:
        self.received = 0
        super().__init__()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            for n, _ in enumerate(requests_on(conn)):
                self.received += 1
                if n:
                    time.sleep(0.01)
                    return
                conn.sendall(HEAD + ROLE + TOKEN + DONE)


def test_a_server_that_closes_a_reused_connection_unanswered_gets_one_per_request() -> None:
    """The first request that a server leaves unanswered on a reused connection fails, as sent
    (never resent); the pool then opens a connection per request, and every later one is answered,
    where before every second request failed the same way."""
    server = ClosesReusedServer()

    async def go() -> tuple[list[Exchange], dict[str, str]]:
        timeouts = Timeouts(first_token_s=30, idle_s=30, total_s=60)
        async with StreamingClient(1, timeouts, {}) as client:
            out = []
            for i in range(12):
                out.append(await client.stream(server.url, b"{}", f"r{i}"))
                await asyncio.sleep(0.06)  # past the probation: the connection is reused
            return out, client.health()

    try:
        got, health = aio.run(go())
    finally:
        server.close()
    failed = [i for i, ex in enumerate(got) if not ex.ok]
    assert failed == [1] and got[1].error_kind == "connect", [ex.error for ex in got]
    assert server.received == 12 and health["connections"] == "one per request"


def test_one_flooding_connection_does_not_starve_the_others() -> None:
    """The backlog hands each connection one held read in turn: a connection that always has
    reads held (a flood) gives way to the others after each read."""
    from harness.wire.connection import Backlog

    released: list[str] = []

    class Held:
        def __init__(self, name: str, reads: int) -> None:
            self.name, self.held = name, [b"x" * 65536] * reads

        def release_one(self) -> None:
            self.held.pop()
            released.append(self.name)

    async def main() -> None:
        backlog = Backlog(asyncio.get_running_loop(), Turns())
        flood, quiet = Held("flood", 10_000), Held("quiet", 2)
        backlog.add(flood)  # type: ignore[arg-type]
        backlog.add(quiet)  # type: ignore[arg-type]
        while flood.held or quiet.held:
            await asyncio.sleep(0)

    aio.run(main())
    assert released.index("quiet") <= 1 and released.count("quiet") == 2
    assert [i for i, n in enumerate(released) if n == "quiet"][1] <= 3  # one read of the flood between


def test_https_streams_through_the_same_transport_with_the_same_stamps(tmp_path: Path) -> None:
    """A local TLS server with a self-signed certificate made here (trusted through SSL_CERT_FILE):
    the stream goes through kvbench's own transport, stamped at socket reads, with the same
    records as over http."""
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)

    class TLSServer(OneAnswerServer):
        def _one(self, conn: socket.socket) -> None:
            with contextlib.suppress(OSError):
                super()._one(ctx.wrap_socket(conn, server_side=True))

    plain = OneAnswerServer(HEAD + ROLE + TOKEN * 5 + DONE, close=False)
    secure = TLSServer(HEAD + ROLE + TOKEN * 5 + DONE, close=False)

    async def go(url: str) -> tuple[list[tuple[object, ...]], dict[str, str]]:
        async with StreamingClient(2, Timeouts(first_token_s=10, idle_s=10, total_s=10), {}) as client:
            return [seen(await client.stream(url, b"{}", f"r{i}", answer=[])) for i in range(3)], client.health()

    old = os.environ.get("SSL_CERT_FILE")
    os.environ["SSL_CERT_FILE"] = str(ca_file)
    try:
        over_http, _ = aio.run(go(plain.url))
        over_https, health = aio.run(go(secure.url.replace("http://", "https://")))
    finally:
        plain.close()
        secure.close()
        if old is None:
            os.environ.pop("SSL_CERT_FILE")
        else:
            os.environ["SSL_CERT_FILE"] = old
    assert over_https == over_http and over_https[0][0] is True
    assert health["transport"] == "kvbench" and health["stamping"] == "socket-read"
