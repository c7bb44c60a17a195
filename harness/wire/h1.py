"""HTTP/1.1 responses, parsed as their bytes arrive (pure, no I/O): the status line and headers,
then the body as its framing says (chunked, Content-Length, or up to the connection's end).

kvbench's own streaming transport (client.py) reads responses with this rather than aiohttp's
parser, which calls back into Python for every HTTP chunk (one SSE event each, from most
engines). Here a read's whole chunks are taken together: one split at the CRLFs, and the sizes
checked against the lengths in one comparison. What does not fit that shape (a chunk extension
or trailer, a CRLF inside a chunk's data, a read that ends inside a chunk) goes through an exact
chunk-by-chunk loop, so the body is the same either way (tests/test_h1.py checks it on random
framings split at random).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat

# Bounds on what a server may send before its body, or between two chunks' data: beyond them the
# response is refused (a server streaming headers or a size line without end must not take the
# client's memory).
MAX_HEAD_BYTES = 64 << 10
MAX_SIZE_LINE_BYTES = 1024  # a chunk-size line with its extensions, or a trailer line
MAX_SIZE_DIGITS = 15  # a chunk of up to 2**60 bytes

_HEX = b"0123456789abcdefABCDEF"
# The sizes of the chunks engines send (an SSE event each), as servers write them: looked up
# rather than checked and parsed one by one
_SIZES = {**{b"%x" % i: i for i in range(1, 8192)}, **{b"%X" % i: i for i in range(1, 8192)}, b"0": 0}
_NO_BODY = frozenset((204, 304))
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


def _drop(_data: bytes) -> None:
    """No one to hand body bytes to (between feeds)."""


class ProtocolError(ValueError):
    """The response broke HTTP/1.1's rules."""


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]  # names lowercased, in the order sent
    keep_alive: bool  # the connection may carry another request after this response

    def get(self, name: str) -> str | None:
        """The last value of a header (name in lower case), or None."""
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found


def _head(raw: bytes) -> Head:
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise ProtocolError(f"malformed header line: {line[:100]!r}")
        headers.append((name.lower(), value.strip(" \t")))
    connection = {t.strip().lower() for k, v in headers if k == "connection" for t in v.split(",")}
    keep = "close" not in connection and (version != "HTTP/1.0" or "keep-alive" in connection)
    return Head(int(code), reason, tuple(headers), keep)


def _size(line: bytes) -> int:
    """A chunk-size line's size (extensions after ';' are ignored, as RFC 9112 allows)."""
    digits = line.split(b";", 1)[0].rstrip(b" \t")
    if not digits or len(digits) > MAX_SIZE_DIGITS or digits.translate(None, _HEX):
        raise ProtocolError(f"bad chunk size line: {line[:100]!r}")
    return int(digits, 16)


# skip(buf, pos) -> end: called at the start of a chunk (`pos`, once per read): the caller takes
# the whole chunks buf[pos:end] as they are, framing and all, already checked (pos: none)
Skip = Callable[[bytes, int], int]


class ResponseParser:
    """One response. `feed` hands the body bytes each read completes to `body`, in order (and,
    with `skip`, runs of whole chunks to it); `head` is set once the headers are in (1xx
    interim responses are skipped), `done` once the whole message is, and `extra` then holds
    any bytes the server sent beyond it. The callbacks are given to each `feed`, not kept: a
    parser kept by the object whose methods they are would make a reference cycle per
    response, garbage only the cyclic collector frees (its pauses delay the loop)."""

    __slots__ = ("_buf", "_left", "_mode", "_state", "body", "done", "extra", "head", "skip")

    def __init__(self) -> None:
        self.body: Callable[[bytes], None] = _drop
        self.skip: Skip | None = None
        self.head: Head | None = None
        self.done = False
        self.extra = b""
        self._buf = b""  # an unfinished head, size line, CRLF or trailer line
        self._mode = ""  # "chunked", "length" or "close"
        self._state = _SIZE
        self._left = 0  # body bytes still to come: the chunk's, or Content-Length's

    def feed(self, data: bytes, body: Callable[[bytes], None], skip: Skip | None = None) -> None:
        self.body, self.skip = body, skip
        try:
            self._feed(data)
        finally:
            self.body, self.skip = _drop, None

    def _feed(self, data: bytes) -> None:
        if self.done:
            self.extra += data
            return
        if self._buf:
            data, self._buf = self._buf + data, b""
        if self.head is None:
            data = self._take_head(data)
            if self.head is None or not data:
                return
        if self._mode == "chunked":
            self._chunked(data)
        elif self._mode == "length":
            body, rest = data[: self._left], data[self._left :]
            self._left -= len(body)
            if not self._left:
                self.done, self.extra = True, rest
            self.body(body)
        else:
            self.body(data)

    def eof(self) -> None:
        """The connection ended: a body that runs to it is complete; anything else was cut."""
        if self.done:
            return
        if self.head is not None and self._mode == "close":
            self.done = True
            return
        where = "in its headers" if self.head is None else "in its body"
        raise ProtocolError(f"the server closed the connection {where}")

    def _take_head(self, data: bytes) -> bytes:
        while True:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response headers beyond {MAX_HEAD_BYTES:,} bytes")
                self._buf = data
                return b""
            head = _head(data[:end])
            data = data[end + 4 :]
            if not 100 <= head.status < 200:
                break
        self.head = head
        encoding = head.get("transfer-encoding")
        length = head.get("content-length")
        if head.status in _NO_BODY:
            self._mode, self.done, self.extra = "length", True, data
        elif encoding is not None:
            self._mode = "chunked" if encoding.lower().rsplit(",", 1)[-1].strip() == "chunked" else "close"
        elif length is not None:
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length: {length[:40]!r}")
            self._mode, self._left = "length", int(length)
            if not self._left:
                self.done, self.extra = True, data
        else:
            self._mode = "close"
        if self._mode == "close":
            self.head = Head(head.status, head.reason, head.headers, False)
        return data

    def _chunked(self, buf: bytes) -> None:
        out: list[bytes] = []
        pos, n = 0, len(buf)
        skip = self.skip  # the caller's runs, then whole chunks at once: once per read each (see _whole)
        tried = False
        while pos < n:
            state = self._state
            if state == _DATA:
                take = min(self._left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if n - pos < 2:
                    if buf[pos:] != b"\r":
                        raise ProtocolError("no CRLF after a chunk's data (bad chunk size?)")
                    self._buf = buf[pos:]
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("no CRLF after a chunk's data (bad chunk size?)")
                pos += 2
                self._state = _SIZE
            elif state == _SIZE and skip is not None:
                if out:  # what came before the run goes first
                    self.body(out[0] if len(out) == 1 else b"".join(out))
                    out.clear()
                pos, skip = skip(buf, pos), None
            elif state == _SIZE and not tried:
                tried = True
                pos = self._whole(buf, pos, out)
            else:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    if n - pos > MAX_SIZE_LINE_BYTES:
                        raise ProtocolError("a chunk size or trailer line without end")
                    self._buf = buf[pos:]
                    break
                line = buf[pos:line_end]
                pos = line_end + 2
                if state == _TRAILER:
                    if not line:
                        self._state, self.done, self.extra = _DONE, True, buf[pos:]
                        break
                else:
                    self._left = _size(line)
                    self._state = _DATA if self._left else _TRAILER
        if out:
            self.body(out[0] if len(out) == 1 else b"".join(out))

    def _whole(self, buf: bytes, pos: int, out: list[bytes]) -> int:
        """Take the whole chunks from `pos` (a size line's start) at once, up to the last chunk
        (no trailers) or the first that does not fit "size CRLF data CRLF" with no CRLF in its
        data; return where the rest starts. Tried once per read: after a chunk that did not fit,
        the rest of the read goes chunk by chunk (trying again after each would split the read
        once per chunk)."""
        parts = buf[pos:].split(b"\r\n")
        pairs = (len(parts) - 1) // 2  # a size line and its data, each followed by CRLF
        if not pairs:
            return pos
        sizes, data = parts[0 : 2 * pairs : 2], parts[1 : 2 * pairs : 2]
        want = list(map(_SIZES.get, sizes))
        if None in want:
            if not all(sizes) or max(map(len, sizes)) > MAX_SIZE_DIGITS or b"".join(sizes).translate(None, _HEX):
                return pos  # extensions or a bad size: chunk by chunk, which says which
            want = list(map(int, sizes, repeat(16)))
        have = list(map(len, data))
        fit = pairs if want == have else next(i for i, (w, h) in enumerate(zip(want, have, strict=True)) if w != h)
        last = want.index(0, 0, fit) if 0 in want[:fit] else -1
        if last >= 0:  # "0" CRLF CRLF: the body's end, without trailers
            fit = last + 1
            self._state, self.done = _DONE, True
        taken = data[: last if last >= 0 else fit]
        if taken:
            out.append(taken[0] if len(taken) == 1 else b"".join(taken))
        if fit == pairs:  # what is left: the parts after the last pair, with the CRLFs between them
            rest = parts[2 * pairs :]
            pos = len(buf) - sum(map(len, rest)) - 2 * (len(rest) - 1)
        else:
            pos += sum(map(len, parts[: 2 * fit])) + 4 * fit
        if self.done:
            self.extra = buf[pos:]
            return len(buf)
        return pos
