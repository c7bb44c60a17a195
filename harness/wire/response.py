"""One streamed response's bytes to what they say (pure, no I/O): its HTTP framing (http1.py),
its SSE (sse.py), what the stream says (stream.py, into the exchange's state), or, for a status
other than 200, its first bytes.

Runs of whole HTTP chunks that are each one token event of the stream's template are taken from
the raw bytes, framing and all (StreamState.chunked_run_end), above the parser; everything else is
decoded from the body llhttp hands over. `feed` raises http1.ProtocolError, SSELimitError and
TooManyTokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.wire import http1
from harness.wire.sse import SSEDecoder
from harness.wire.stream import FramePatterns

if TYPE_CHECKING:
    from harness.wire.client import Exchange

ERROR_BODY_BYTES = 65536  # of a response that is not 200: what its error message is taken from


class TooManyTokens(ValueError):
    """A response went on past the token chunks it may carry (Exchange.token_limit)."""


def too_many(limit: int) -> str:
    return f"more than {limit:,} token chunks in one response (max_response_tokens)"


class Response:
    __slots__ = ("decoder", "error_body", "ex", "frames", "head_from", "over", "parser", "t")

    def __init__(self, ex: Exchange, max_line_bytes: int, frames: FramePatterns) -> None:
        self.ex, self.frames = ex, frames
        self.parser = http1.ResponseParser()
        self.decoder = SSEDecoder(max_line_bytes, skip=ex.state.run_end)
        self.error_body: list[bytes] | None = None  # a response that is not 200: its first bytes
        self.t = 0  # the stamp of the read being fed
        self.over = False  # the exchange has ended: only the framing is read on
        self.head_from: int | None = None  # the stamp of the response's first byte

    def feed(self, t: int, data: bytes) -> None:
        self.t = t
        if self.head_from is None and data:
            self.head_from = t
        parser = self.parser
        # bytes after the declared end are no request's (a stray answer, or a body longer than
        # declared): the response keeps the outcome of its own bytes, however the reads were cut,
        # and its connection is not reused (`reusable`)
        parser.feed(data, self._body, self._skip)
        self._headers()
        state = self.ex.state
        if len(state.token_chunk_ns) > self.ex.token_limit:
            raise TooManyTokens(too_many(self.ex.token_limit))
        if parser.done and self.error_body is None and not (self.over or state.done or state.error):
            state.on_events(self.decoder.close(), t)

    def _headers(self) -> None:
        ex, head = self.ex, self.parser.head
        if ex.http_status is None and head is not None:
            ex.http_status, ex.headers_ns = head.status, self.t
            if head.status != 200:
                self.error_body = []
            elif (coding := head.get("content-encoding")) and coding.strip().lower() != "identity":
                raise http1.ProtocolError(
                    f"the server compressed the stream (Content-Encoding: {coding[:40]}), though kvbench asked for "
                    "none (Accept-Encoding: identity): kvbench does not decode compressed streams"
                )

    def _body(self, data: bytes) -> None:
        """Body bytes, in order (the parser's callback)."""
        if self.over or not data:
            return
        self._headers()
        if self.error_body is not None:
            if sum(map(len, self.error_body)) < ERROR_BODY_BYTES:
                self.error_body.append(data)
            return
        state = self.ex.state
        if state.done:  # nothing after [DONE] counts
            return
        if state.first_byte_ns is None:
            state.first_byte_ns = self.t
        events = self.decoder.feed(data)
        if events:
            state.on_events(events, self.t)

    def _skip(self, buf: bytes, start: int) -> int:
        """The parser's skip: a run of whole token chunks from `start`, unless the SSE decoder is
        inside an event there (or there is no template yet)."""
        state = self.ex.state
        if state.template is None or self.over or state.done:
            return start
        self._headers()
        if self.error_body is not None or not self.decoder.between_events():
            return start
        end = state.chunked_run_end(buf, start, self.frames)
        if end > start:
            if state.first_byte_ns is None:
                state.first_byte_ns = self.t
            # four LFs a chunk: after its size, its event's line and blank line, after its data
            state.take_run(state.template, buf, start, end, buf.count(b"\n", start, end) // 4, self.t)
        return end

    def ended(self) -> bool:
        """Is there nothing more to wait for: the body's end, enough of an error's body, or
        [DONE] (or an error event) in the stream?"""
        if self.parser.done:
            return True
        if self.error_body is not None:
            return sum(map(len, self.error_body)) >= ERROR_BODY_BYTES
        return self.ex.state.done or self.ex.state.error is not None

    def reusable(self) -> bool:
        """May the connection carry another request?"""
        p = self.parser
        return p.done and not p.extra and p.head is not None and p.head.keep_alive

    def error_text(self) -> str:
        body = b"".join(self.error_body or ())[:ERROR_BODY_BYTES]
        return body.decode("utf-8", "replace").strip()  # cut by the client once secrets are out
