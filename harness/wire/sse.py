"""Incremental Server-Sent Events decoder (pure, no I/O).

Bytes go in as they arrive from the socket, in pieces of any size; complete events come out.
Lines may end in CRLF, LF or CR (the SSE spec allows all three) and may be split anywhere. A
line (or an event's data) longer than `max_line_bytes` raises SSELimitError: a server that
streams without ever ending a line must not take the client's memory. The unfinished line is
kept as a list of pieces and joined once, when its end arrives, so work stays linear in the
bytes received however the line is split.

A decoder may be given `skip`: asked at the first event boundary in a read, it names a run of whole
events from there on that it will take undecoded (stream.py's token chunks that differ only in
their text); the run comes out as one `Run`, in order with the events around it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.config.scenario import MAX_LINE_BYTES


class SSELimitError(ValueError):
    """A line or an event beyond the decoder's limit."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    data: bytes
    event: str | None = None
    id: str | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """Whole events, `buf[start:end]` ("data: ...\n\n" each), that `skip` took undecoded."""

    buf: bytes
    start: int
    end: int


# skip(buf, start) -> (first, end): the run of events it takes, buf[first:end], where `start` is an
# event boundary and `first` is `start` or just after a blank line ("\n\n"); first == end for none
Skip = Callable[[bytes, int], tuple[int, int]]


class SSEDecoder:
    __slots__ = (
        "_buf",
        "_data",
        "_data_len",
        "_event",
        "_has_data",
        "_id",
        "_pending",
        "_pending_len",
        "max_line_bytes",
        "skip",
    )

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES, skip: Skip | None = None) -> None:
        self.max_line_bytes = max_line_bytes
        self.skip = skip
        self._buf = b""
        self._pending: list[bytes] = []  # an unfinished line that outgrew one piece
        self._pending_len = 0
        self._data: list[bytes] = []
        self._data_len = 0  # the event's data so far, a byte for each line's end included
        self._event: str | None = None
        self._id: str | None = None
        self._has_data = False

    def feed(self, chunk: bytes) -> list[SSEEvent | Run]:
        """Add bytes; return the events they complete (possibly none), and runs (with `skip`)."""
        if self._buf and b"\n" not in chunk and b"\r" not in chunk and not self._buf.endswith(b"\r"):
            # still inside one line: keep the piece, join nothing (a held CR may end the line)
            self._pending.append(chunk)
            self._pending_len += len(chunk)
            if len(self._buf) + self._pending_len > self.max_line_bytes:
                self._too_long("line")
            return []
        if self._pending:
            buf = b"".join((self._buf, *self._pending, chunk))
            self._pending, self._pending_len = [], 0
        else:
            buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # A CR at the very end may be the first half of a CRLF: keep it until we know.
            hold_cr = buf.endswith(b"\r")
            if hold_cr:
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if hold_cr:
                buf += b"\r"
        out: list[SSEEvent | Run] = []
        if self.skip is not None:
            buf = self._skip_run(buf, out, self.skip)
        self._lines(buf, out)
        return out

    def between_events(self) -> bool:
        """Has every byte fed so far ended in a whole event (or comment)? The next byte starts
        a new one."""
        return not (self._buf or self._pending or self._has_data or self._data) and self._event is None

    def _skip_run(self, buf: bytes, out: list[SSEEvent | Run], skip: Skip) -> bytes:
        """Decode up to the first event boundary in `buf`, let `skip` take a run from there on;
        return the bytes after it."""
        start = 0
        if self._has_data or self._event is not None:  # inside an event: it ends at the first blank line
            if buf[:1] == b"\n":
                start = 1
            else:
                start = buf.find(b"\n\n") + 2
                if start < 2:
                    return buf
        first, end = skip(buf, start)
        if end > first:
            self._lines(buf[:first], out)
            out.append(Run(buf, first, end))
            return buf[end:]
        if start:
            self._lines(buf[:start], out)
        return buf[start:] if start else buf

    def _lines(self, buf: bytes, out: list[SSEEvent | Run]) -> None:
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > self.max_line_bytes:
            self._too_long("line")
        for line in lines:
            # The common case inline (one call per line costs more than the work it does).
            if line[:6] == b"data: ":
                self._data.append(line[6:])
                self._data_len += len(line) - 5
                self._has_data = True
            elif not line and self._has_data and self._event is None:
                data = self._data
                out.append(SSEEvent(data[0] if len(data) == 1 else b"\n".join(data), None, self._id))
                self._data = []
                self._data_len = 0
                self._has_data = False
            else:
                self._line(line, out)
        if self._data_len > self.max_line_bytes:  # (empty `data:` lines count a byte each)
            self._too_long("event")

    def _too_long(self, what: str) -> None:
        self._buf, self._pending, self._pending_len, self._data, self._data_len = b"", [], 0, [], 0
        raise SSELimitError(f"an SSE {what} of more than {self.max_line_bytes:,} bytes (max_line_bytes)")

    def close(self) -> list[SSEEvent | Run]:
        """End of stream: a final event without its blank line is still delivered."""
        out: list[SSEEvent | Run] = []
        rest = b"".join((self._buf, *self._pending)).rstrip(b"\r")
        self._buf, self._pending, self._pending_len = b"", [], 0
        if rest:
            self._line(rest, out)
        self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[SSEEvent | Run]) -> None:
        if not line:
            if self._has_data:
                out.append(SSEEvent(b"\n".join(self._data), self._event, self._id))
            self._data = []
            self._data_len = 0
            self._event = None
            self._has_data = False
            return
        if line[0] == 0x3A:  # ":" comment, e.g. ": keep-alive"
            return
        field, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if field == b"data":
            self._data.append(value)
            self._data_len += len(value) + 1
            self._has_data = True
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id":
            self._id = value.decode("utf-8", "replace")
        # "retry" and unknown fields are ignored, as the spec says.
