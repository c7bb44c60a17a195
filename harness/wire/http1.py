"""HTTP/1.1 responses, framed by llhttp (httptools, the parser uvicorn uses), as their bytes
arrive (pure, no I/O).

llhttp decides the framing and refuses what RFC 9112 refuses: conflicting or duplicate
Content-Length, Transfer-Encoding with Content-Length, control characters in header values,
non-ASCII digits, bad chunk sizes. Around it, kvbench adds what a client needs of a parser:
bounds (head size, header count, bytes fed without any progress, so that endless headers, size
lines or trailers cannot take memory), 1xx interim responses skipped and `101` refused (kvbench
asks for no upgrade), obs-fold header lines unfolded as RFC 9112 asks of clients, and bytes
after the declared end of the response seen (`extra`: no request's, so the connection is not
reused).

The fast path stays a layer above the parser: at a read that starts at a chunk boundary, or at
the first boundary found in it, `skip` may take a run of whole chunks (stream.py's token chunks,
each size checked) that llhttp then never sees; between chunks llhttp holds no state for them, so
it parses the rest as if they had never been sent. tests/test_http1.py proves the events are the
same as parsing every chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import httptools

# Bounds on what a server may send before its body, or between two chunks' data: beyond them the
# response is refused.
MAX_HEAD_BYTES = 64 << 10
MAX_HEADERS = 128
# Bytes fed in a row that moved the parse no further (no header, chunk or body byte done): an
# endless size line, extension or trailer
MAX_STALL_BYTES = 64 << 10

# Chunk boundaries tried for a run of token chunks in one read (see ResponseParser._skip)
SKIP_TRIES = 3

_FOLD = re.compile(rb"\r\n[ \t]+")


class ProtocolError(ValueError):
    """The response broke HTTP/1.1's rules."""


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]  # names lowercased, in the order sent
    keep_alive: bool  # the connection may carry another request after this response
    chunked: bool

    def get(self, name: str) -> str | None:
        """The last value of a header (name in lower case), or None."""
        return _last(name, self.headers)


def _last(name: str, headers: tuple[tuple[str, str], ...]) -> str | None:
    return next((v for k, v in reversed(headers) if k == name), None)


def _drop(_data: bytes) -> None:
    """No one to hand body bytes to (between feeds)."""


# skip(buf, pos) -> end: called at a chunk boundary `pos` (at most once per read): the caller
# takes the whole chunks buf[pos:end] as they are, framing and all, already checked (pos: none)
Skip = Callable[[bytes, int], int]


class ResponseParser:
    """One response. `feed` hands the body bytes each read completes to `body`, in order (and, with
    `skip`, runs of whole chunks to it); `head` is set once the headers are in, `done` once the
    whole message is. The callbacks are given to each `feed`, not kept, and llhttp's parser (which
    holds this object) is dropped once the response is over: no reference cycle outlives a
    response (the cyclic collector's pauses would delay the loop)."""

    __slots__ = (
        "_boundary",
        "_head_raw",
        "_headers",
        "_last_chunk",
        "_out",
        "_parser",
        "_progress",
        "_reason",
        "_stalled",
        "body",
        "done",
        "extra",
        "head",
    )

    def __init__(self) -> None:
        self._parser: httptools.HttpResponseParser | None = _new_llhttp(self)
        self.body: Callable[[bytes], None] = _drop
        self.head: Head | None = None
        self.done = False
        self.extra = False  # bytes came after the response's end
        self._out: list[bytes] = []
        self._headers: list[tuple[str, str]] = []
        self._reason = ""
        self._head_raw: list[bytes] | None = []  # the bytes fed before the head was in (for obs-fold)
        self._boundary = False  # the bytes fed so far end exactly between two chunks
        self._last_chunk = False
        self._progress = 0  # parser events so far
        self._stalled = 0  # bytes fed since the last one

    # -- feeding ------------------------------------------------------------------------------

    def feed(self, data: bytes, body: Callable[[bytes], None], skip: Skip | None = None) -> None:
        """Parse one read. Raises ProtocolError."""
        if self.done or self._parser is None:
            if data:
                self.extra = True
            return
        self.body = body
        try:
            if skip is not None and self.head is None:
                data = self._head_first(data)
            if skip is not None and self.head is not None and self.head.chunked:
                data = self._skip(data, skip)
            if data:
                self._parse(data)
            self._flush()
        finally:
            self.body = _drop

    def _head_first(self, data: bytes) -> bytes:
        """Parse up to the first blank line, where the head most likely ends, so that the body
        in the same read can start with a run for `skip`; returns the rest. (If the head ended
        earlier, llhttp has parsed more than the head: correct, only slower.)"""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return data
        self._parse(data[: end + 4])
        return data[end + 4 :]

    def _skip(self, data: bytes, skip: Skip) -> bytes:
        """Let `skip` take a run of whole chunks at the read's start, if that is a chunk boundary,
        or else at the first place that looks like one (`CRLF` and a hex size line, then `data:`):
        the bytes before it are parsed first, and if llhttp then stands between two chunks there,
        the run is taken from there. Where `skip` takes nothing, the next boundary is tried, up to
        SKIP_TRIES in all: a response's first read starts with a role chunk, then the first token
        chunk, which teaches the stream's template, and only then a run. Returns what is left to
        parse."""
        at_boundary = self._boundary
        for _ in range(SKIP_TRIES):
            if not at_boundary:
                cut = _candidate(data)
                if cut <= 0:
                    return data
                self._parse(data[:cut])
                data = data[cut:]
                if not self._boundary or self.done:
                    return data
            self._flush()
            end = skip(data, 0)
            if end:
                return data[end:]
            at_boundary = False
        return data

    def _parse(self, data: bytes) -> None:
        if self._parser is None:  # the message ended inside this read (a bodyless response)
            self.extra = self.extra or bool(data)
            return
        if self.head is None and self._head_raw is not None:
            self._head_raw.append(data)
        progress = self._progress
        self._llhttp(data)
        if self.head is None and self._head_raw is not None and sum(map(len, self._head_raw)) > MAX_HEAD_BYTES:
            raise ProtocolError(f"response headers beyond {MAX_HEAD_BYTES:,} bytes")
        self._stalled = self._stalled + len(data) if self._progress == progress else 0
        if self._stalled > MAX_STALL_BYTES:
            raise ProtocolError(f"{self._stalled:,} bytes with no end of line in the response's framing")
        self._boundary = self._boundary and data.endswith(b"\r\n")

    def _llhttp(self, data: bytes, unfolded: bool = False) -> None:
        parser = self._parser
        assert parser is not None
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as e:
            raise ProtocolError("the server switched protocols (101) though kvbench asked for no upgrade") from e
        except httptools.HttpParserError as e:
            if isinstance(e.__context__, ProtocolError):  # raised by a callback below
                raise e.__context__ from None
            if self.done:  # what came after the end: not this response's bytes
                self.extra = True
                return
            head = None if unfolded or self.head is not None else self._unfold()
            if head is None:
                raise ProtocolError(str(e) or type(e).__name__) from e
            # an obs-fold (a header line continued after a space) made llhttp fail: the head so
            # far, unfolded as RFC 9112 5.2 asks of a client, to a new parser
            self._parser = _new_llhttp(self)
            self._headers = []
            self._llhttp(head, unfolded=True)

    def _unfold(self) -> bytes | None:
        """The bytes fed so far with every obs-fold of the head replaced by a space; None: none."""
        raw = b"".join(self._head_raw or ())
        end = raw.find(b"\r\n\r\n")
        head = raw if end < 0 else raw[:end]
        return _FOLD.sub(b" ", head) + raw[len(head) :] if _FOLD.search(head) else None

    def _flush(self) -> None:
        out = self._out
        if out:
            self.body(out[0] if len(out) == 1 else b"".join(out))
            out.clear()

    def eof(self) -> None:
        """The connection ended: a body that runs to it is complete; anything else was cut."""
        if self.done:
            return
        if self.head is not None and not self.head.chunked and self.head.get("content-length") is None:
            self._end()
            return
        self.close()
        where = "in its headers" if self.head is None else "in its body"
        raise ProtocolError(f"the server closed the connection {where}")

    def close(self) -> None:
        """Let go of llhttp's parser (the response is over, one way or another)."""
        self._parser = None

    def _end(self) -> None:
        self.done = True
        self._parser = None

    # -- llhttp's callbacks ---------------------------------------------------------------------

    def _beyond(self) -> bool:
        """Is llhttp past this response's end (a second message)? Then its bytes are extra."""
        if self.done:
            self.extra = True
        return self.done

    def on_status(self, reason: bytes) -> None:
        self._progress += 1
        if self._beyond():
            return
        self._reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._progress += 1
        if self._beyond():
            return
        if len(self._headers) >= MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} header lines")
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")))

    def on_headers_complete(self) -> None:
        self._progress += 1
        if self._beyond():
            return
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        if status == 101:
            raise ProtocolError("the server switched protocols (101) though kvbench asked for no upgrade")
        if 100 <= status < 200:  # interim: the real head follows
            self._headers = []
            return
        headers = tuple(self._headers)
        encoding = _last("transfer-encoding", headers)
        chunked = encoding is not None and encoding.lower().rsplit(",", 1)[-1].strip() == "chunked"
        self.head = Head(status, self._reason, headers, parser.should_keep_alive(), chunked)
        self._head_raw = None
        self._boundary = chunked

    def on_body(self, data: bytes) -> None:
        self._progress += 1
        if self._beyond():
            return
        self._out.append(data)

    def on_chunk_header(self) -> None:
        self._progress += 1
        self._boundary = False

    def on_chunk_complete(self) -> None:
        self._progress += 1
        self._boundary = True

    def on_message_complete(self) -> None:
        self._progress += 1
        if self.head is None or self._beyond():  # the end of an interim response, or of a second one
            return
        self.done = True
        self._boundary = False
        self._parser = None  # (llhttp keeps its own reference while it parses on)

    def on_message_begin(self) -> None:
        self._beyond()


def _new_llhttp(callbacks: ResponseParser) -> httptools.HttpResponseParser:
    parser = httptools.HttpResponseParser(callbacks)
    # RFC 9112 7.1.1 allows white space (BWS) before a chunk extension's ";", which llhttp refuses
    # by default (a proxy's smuggling guard; a client reading its own responses has none to fear)
    parser.set_dangerous_leniencies(lenient_spaces_after_chunk_size=True)
    return parser


# "CRLF size CRLF data:" where a chunk holding an SSE event starts
_CHUNK_START = re.compile(rb"\r\n[0-9a-fA-F]{1,8}\r\ndata:")


def _candidate(data: bytes) -> int:
    """The offset just after the CRLF that ends a chunk's data, where the next chunk looks like
    an SSE event's (-1: none found). Only a candidate: the caller checks with llhttp."""
    m = _CHUNK_START.search(data)
    return -1 if m is None else m.start() + 2
