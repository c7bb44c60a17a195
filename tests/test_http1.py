"""The HTTP/1.1 response parser of kvbench's transport (llhttp with kvbench's bounds and rules):
bodies as their framing says, however the bytes are framed and split into reads, as h11 reads
them; broken framing refused, and bounded."""

from __future__ import annotations

import h11
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.wire.http1 import MAX_HEAD_BYTES, MAX_HEADERS, ProtocolError, ResponseParser

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def parse(reads: list[bytes], eof: bool = False) -> tuple[bytes, ResponseParser]:
    pieces: list[bytes] = []
    p = ResponseParser()
    for r in reads:
        p.feed(r, pieces.append)
    if eof:
        p.eof()
    return b"".join(pieces), p


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# Chunk data: SSE events (one chunk each, as engines send them), and anything else, CRLFs included
payloads = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=40),
        st.sampled_from([b"data: {}\n\n", b"data: x\r\n\r\n", b"\r\n", b"0\r\n\r\n", b"5\r\nhello"]),
    ),
    max_size=30,
)


@st.composite
def framings(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A chunked response: (its bytes, its body). Sizes in either case, with leading zeros or
    extensions now and then; trailers sometimes."""
    parts = draw(payloads)
    out = [HEAD]
    for p in parts:
        size = b"%x" % len(p)
        size = draw(st.sampled_from([size, size.upper(), b"0" + size, size + b";ext=1", size + b" ;x"]))
        out.append(b"%s\r\n%s\r\n" % (size, p))
    out.append(b"0\r\n" + draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"])) + b"\r\n")
    return b"".join(out), b"".join(parts)


@settings(max_examples=400, deadline=None)
@given(framings(), st.lists(st.integers(min_value=0), max_size=12), st.binary(max_size=8))
def test_a_chunked_body_is_its_chunks_however_it_is_framed_and_split(
    response: tuple[bytes, bytes], cuts: list[int], after: bytes
) -> None:
    raw, want = response
    body, p = parse(split(raw, cuts))
    assert body == want and p.done and not p.extra
    assert p.head is not None and p.head.status == 200 and p.head.keep_alive
    if b" ;" not in raw:  # (h11 refuses the white space RFC 9112 allows before an extension)
        assert body == h11_body(raw)
    if after.strip(b"\r\n"):  # bytes beyond the response's end are seen, whatever read they come in
        # (llhttp skips empty lines between messages, as RFC 9112 2.2 allows: harmless)
        _, p = parse(split(raw + after, cuts))
        assert p.extra


def h11_body(raw: bytes) -> bytes:
    """The body h11 (a second, independent parser) reads from a response."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    out = []
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            out.append(bytes(event.data))
        elif isinstance(event, h11.EndOfMessage | h11.NEED_DATA) or event is h11.NEED_DATA:
            return b"".join(out)


def test_one_chunk_per_event_in_one_read() -> None:
    events = [b"data: %d\n\n" % i for i in range(100)]
    raw = HEAD + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    body, p = parse([raw])
    assert body == b"".join(events) and p.done and not p.extra


def test_length_close_and_interim_responses() -> None:
    body, p = parse([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad\r\nContent-Length: 5\r\n\r\nhel", b"loXX"])
    assert body == b"hello" and p.done and p.extra and p.head is not None and p.head.status == 400
    body, p = parse([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nsome", b" text"], eof=True)
    assert body == b"some text" and p.done and p.head is not None and not p.head.keep_alive
    body, p = parse([b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"])
    assert body == b"" and p.done and p.head is not None and not p.head.keep_alive
    body, p = parse([b"HTTP/1.1 204 No Content\r\n\r\n"])
    assert body == b"" and p.done and p.head is not None and p.head.keep_alive


@pytest.mark.parametrize(
    "raw",
    [
        HEAD + b"zz\r\n",  # not hex
        HEAD + b"0x5\r\nhello\r\n",  # what int(.., 16) would take
        HEAD + b"+5\r\nhello\r\n",
        HEAD + b"\r\nhello\r\n",  # no size
        HEAD + b"5\r\nhello!!\r\n",  # more data than its size: no CRLF after it
        HEAD + b"5\r\nhelloXY",
        HEAD + b"1" * 20 + b"\r\n",  # a size beyond any chunk
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        # what the old parser let through (issue 29)
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 3\r\n\r\nabcde",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\x00b\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: a\rb\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        # non-ASCII digits that str.isdigit() takes (issue 30, case 5)
        "HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode(),
        "HTTP/1.1 200 OK\r\nContent-Length: \u00b9\u00b2\r\n\r\n".encode(),
        b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",
        "HTTP/1.1 \u00b200 OK\r\nContent-Length: 0\r\n\r\n".encode(),
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_HEADERS + 1) + b"\r\n",
    ],
)
def test_broken_framing_is_refused(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse([raw])
    with pytest.raises(ProtocolError):
        parse([raw[i : i + 1] for i in range(len(raw))])


@pytest.mark.parametrize(
    "raw", [HEAD + b"5\r\nhel", HEAD, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc", b"HTTP/1.1"]
)
def test_a_connection_that_ends_early_cuts_the_response(raw: bytes) -> None:
    with pytest.raises(ProtocolError, match="closed the connection"):
        parse([raw], eof=True)


def test_what_a_server_streams_without_end_is_bounded() -> None:
    p = ResponseParser()
    with pytest.raises(ProtocolError, match="headers beyond"):
        p.feed(b"HTTP/1.1 200 OK\r\nX-Long: ", list().append)
        for _ in range(MAX_HEAD_BYTES // 1000 + 2):
            p.feed(b"a" * 1000, list().append)
    for endless in (b"1;" + b"e" * 1000, b"0\r\nX-Trailer: " + b"t" * 1000):
        p = ResponseParser()
        p.feed(HEAD, list().append)
        with pytest.raises(ProtocolError, match="no end of line"):
            for i in range(100):
                p.feed(endless if i == 0 else b"e" * 1000, list().append)


def test_interim_responses_are_skipped_and_obs_fold_is_unfolded() -> None:
    """RFC 9110: a client parses 1xx interim responses it did not ask for; RFC 9112 5.2: it
    replaces each obs-fold with spaces. Chunk sizes with leading zeros are valid."""
    body, p = parse([b"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
    assert body == b"ok" and p.done and p.head is not None and p.head.status == 200 and p.head.get("link") is None
    raw = b"HTTP/1.1 200 OK\r\nX-Long: a\r\n  b\r\n\tc\r\nContent-Length: 2\r\n\r\nok"
    for reads in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        body, p = parse(reads)
        assert body == b"ok" and p.done and p.head is not None and p.head.get("x-long") == "a b c"
    body, p = parse([HEAD + b"0" * 18 + b"3\r\nabc\r\n0\r\n\r\n"])
    assert body == b"abc" and p.done
