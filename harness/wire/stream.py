"""What an OpenAI-compatible streaming response says, and when: the one place that decides
which chunk is the first token.

Pure logic: `StreamState.on_events(events, t_ns)` is fed every SSE event with the monotonic time
at which the bytes carrying it arrived. The first token is the first chunk with a non-empty
`content`, `reasoning`, `reasoning_content`, tool call, or completions `text`. A role-only
chunk, an empty string and a usage chunk are not tokens and never move the first-token time.

The fast path: after the first token, an engine's chunks differ only in the token's text. The
first token chunk parsed gives a `Template` (its bytes with the text left open); later chunks that
fit it, with a text of plain characters, are counted and timed from their bytes, unparsed, and a
decoder with `skip=state.run_end` hands over whole runs of them at once. Anything else (usage,
finish, errors, escapes, another shape) is parsed as before, so the records are the same.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from harness.core.clock import EMULATOR_LATE_KEY
from harness.wire.sse import Run, SSEEvent


@dataclass(frozen=True, slots=True)
class ChunkTokens:
    any_token: bool  # content, reasoning or tool call
    content: bool  # visible content (or completions text)


_NONE = ChunkTokens(False, False)
_CONTENT = ChunkTokens(True, True)
_OTHER = ChunkTokens(True, False)


def chunk_tokens(obj: dict[str, Any]) -> ChunkTokens:
    """Which kinds of token a parsed chunk carries (called for every chunk: kept lean)."""
    choices = obj.get("choices")
    if not choices or type(choices) is not list:
        return _NONE
    found = _NONE
    for choice in choices:
        if type(choice) is not dict:
            continue
        delta = choice.get("delta")
        if type(delta) is dict:
            c = delta.get("content")
            if c and type(c) is str:
                return _CONTENT
            r = delta.get("reasoning_content") or delta.get("reasoning")
            if (r and type(r) is str) or delta.get("tool_calls"):
                found = _OTHER
            continue
        text = choice.get("text")
        if text and type(text) is str:
            return _CONTENT
    return found


def content_of(obj: dict[str, Any]) -> str:
    """The visible text a chunk carries (chat `delta.content`, completions `text`)."""
    out = []
    for choice in obj.get("choices") or ():
        if type(choice) is not dict:
            continue
        delta = choice.get("delta")
        c = delta.get("content") if type(delta) is dict else choice.get("text")
        if c and type(c) is str:
            out.append(c)
    return "".join(out)


def _token_text(obj: dict[str, Any]) -> str | None:
    """The one text a single-choice chunk carries: content, else reasoning, else completions text."""
    choices = obj.get("choices")
    if type(choices) is not list or len(choices) != 1 or type(choices[0]) is not dict:
        return None
    delta = choices[0].get("delta")
    if type(delta) is not dict:
        text = choices[0].get("text")
    else:
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return text if type(text) is str else None


def _finish_reason(obj: dict[str, Any]) -> str | None:
    """The last choice's finish reason that a chunk gives, if any."""
    found = None
    choices = obj.get("choices")
    if choices and type(choices) is list:
        for choice in choices:
            if type(choice) is dict and choice.get("finish_reason"):
                found = str(choice["finish_reason"])
    return found


# A JSON string's body without escapes, quotes or control characters: its bytes are its text.
_TEXT = rb'[^"\\\x00-\x1f]+'
_PROBE = "kvbench"
_UPPER_HEX = frozenset(bytes([c]) for c in b"ABCDEF")
# Chunks longer than this get no template (token chunks are a few hundred bytes): the templates
# kept stay small whatever a server sends.
TEMPLATE_MAX_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Template:
    """A token chunk's bytes with the token's text left open: prefix, text, suffix. The prefix
    ends and the suffix begins with the text's quotes, and neither has a line break."""

    content: bool  # the text is visible content (else reasoning)
    prefix: bytes
    suffix: bytes

    def fits(self, data: bytes) -> bool:
        """Is one event's data this template with a plain text?"""
        p, s = len(self.prefix), len(self.suffix)
        return (
            len(data) > p + s
            and data.startswith(self.prefix)
            and data.endswith(self.suffix)
            and _PLAIN.fullmatch(data, p, len(data) - s) is not None
        )

    def text(self, data: bytes) -> str:
        return data[len(self.prefix) : len(data) - len(self.suffix)].decode()

    def run_end(self, buf: bytes, first: int) -> int:
        """The end of the run of whole events ("data: ...\n\n" each, as the SSE decoder sees
        them) from `first` that fit this template; `first` for none. `_shape` checks the events'
        form and texts; then every event's prefix and suffix are this template's if "data:
        prefix" starts the run and follows each event's end, and "suffix LF LF" ends each event
        (LF LF only ends an event: a plain text has none, nor has the template). Another kind of
        event among them refuses the run (it is decoded one by one)."""
        m = _shape(len(self.prefix), len(self.suffix)).run.match(buf, first)
        if m is None:
            return first
        end = m.end()
        n = buf.count(b"\n", first, end) // 2  # a line and a blank line each
        if (
            not buf.startswith(b"data: " + self.prefix, first)
            or buf.count(b"\n\ndata: " + self.prefix, first, end) != n - 1
            or buf.count(self.suffix + b"\n\n", first, end) != n
        ):
            return first
        return end

    def texts(self, buf: bytes, start: int, end: int) -> bytes:
        """The texts of the events of a run (with or without their HTTP chunks' framing)."""
        return b"".join(_shape(len(self.prefix), len(self.suffix)).texts.findall(buf, start, end))


@dataclass(frozen=True, slots=True)
class _Shape:
    run: re.Pattern[bytes]
    texts: re.Pattern[bytes]


_PLAIN = re.compile(_TEXT)


@functools.lru_cache(maxsize=64)
def _shape(prefix_len: int, suffix_len: int) -> _Shape:
    """The patterns of every template with a prefix and a suffix of these lengths: compiling
    takes a millisecond or more, and engines put a request's own id into its chunks, so that
    each stream learns a template of its own; the template checks its own bytes (run_end)."""
    event = b"data: .{%d}%%s.{%d}\n\n" % (prefix_len, suffix_len)
    return _Shape(run=re.compile(b"(?:" + event % _TEXT + b")+"), texts=re.compile(event % (b"(" + _TEXT + b")")))


# Texts up to this many bytes are taken in chunked runs (chunk_frames); a longer one is decoded
# from the HTTP body as usual. Tokens are a few bytes.
CHUNKED_TEXT_MAX = 48


def chunk_frames(prefix_len: int, suffix_len: int, upper: bool) -> re.Pattern[bytes]:
    """Whole HTTP chunks in a row, each one SSE event of a template's shape: "size CRLF data:
    (prefix_len bytes) text (suffix_len bytes) LF LF CRLF", where the size (hex digits in upper or
    lower case, no extension) is exactly that event's length and the text is plain. A regular
    expression cannot check a size against a length, so there is one branch per text length, up
    to CHUNKED_TEXT_MAX, grouped by the size's first digit (told apart at a glance). The prefix
    and suffix are only counted here, so that the pattern (slow to compile: milliseconds) serves
    every template of those lengths: engines put a request's own id into its chunks, so each
    stream learns a template of its own. `StreamState.chunked_run_end` checks their bytes (and
    gets the pattern from its client's FramePatterns)."""
    event = len(b"data: ") + prefix_len + suffix_len + 2
    groups: dict[bytes, list[bytes]] = {}
    for n in range(1, CHUNKED_TEXT_MAX + 1):
        size = (b"%X" if upper else b"%x") % (event + n)
        frame = b"\r\n.{%d}%s{%d}.{%d}\n\n\r\n" % (len(b"data: ") + prefix_len, _TEXT[:-1], n, suffix_len)
        groups.setdefault(size[:1], []).append(size[1:] + frame)
    branches = b"|".join(first + b"(?:" + b"|".join(rest) + b")" for first, rest in groups.items())
    return re.compile(b"(?:" + branches + b")+")


class FramePatterns:
    """chunk_frames' patterns, compiled when first asked for and kept (an engine's streams share
    one or two): one per client transport, handed to each response it reads. Compiling one
    takes 2-4 ms on the loop's thread; the reads that arrive meanwhile keep their kernel stamps
    (stamps.py), so no thread of its own is needed to keep them early."""

    KEEP = 64  # patterns kept

    def __init__(self) -> None:
        self._ready: dict[tuple[int, int, bool], re.Pattern[bytes]] = {}

    def __len__(self) -> int:
        return len(self._ready)

    def get(self, prefix_len: int, suffix_len: int, upper: bool) -> re.Pattern[bytes]:
        key = (prefix_len, suffix_len, upper)
        pattern = self._ready.get(key)
        if pattern is None:
            if len(self._ready) >= self.KEEP:
                del self._ready[next(iter(self._ready))]
            pattern = self._ready[key] = chunk_frames(*key)
        return pattern


def learn(data: bytes, obj: dict[str, Any], tokens: ChunkTokens) -> Template | None:
    """The template of a parsed one-line token chunk, or None. Its text must appear once in its
    bytes as JSON writes it, and the bytes with another text in its place must parse to a chunk
    that says nothing else: the same kind of token, that text as the token (and the visible
    text), no usage, finish or error. Then any plain text in that place gives such a chunk: a
    JSON string's body swapped for another leaves every other token of the document as it was."""
    text = _token_text(obj)
    if not text or len(data) > TEMPLATE_MAX_BYTES or b"\n" in data:
        return None
    needle = orjson.dumps(text)
    i = data.find(needle)
    if i < 0 or data.find(needle, i + 1) >= 0:
        return None
    return _template(data[: i + 1], data[i + len(needle) - 1 :], tokens)


@functools.lru_cache(maxsize=256)  # an engine's streams share their few templates
def _template(prefix: bytes, suffix: bytes, tokens: ChunkTokens) -> Template | None:
    try:
        probe = orjson.loads(prefix + _PROBE.encode() + suffix)
    except orjson.JSONDecodeError:
        return None
    if (
        type(probe) is not dict
        or probe.get("error")
        or probe.get("usage")
        or _finish_reason(probe) is not None
        or chunk_tokens(probe) is not tokens
        or _token_text(probe) != _PROBE
        or content_of(probe) != (_PROBE if tokens.content else "")
    ):
        return None
    return Template(content=tokens.content, prefix=prefix, suffix=suffix)


# A stream whose chunks keep not fitting the template learnt from the one before (a field that
# changes with every chunk) stops learning after this many templates that fitted nothing.
LEARN_TRIES = 4
# Events looked through for the first token chunk, to learn the template from, before it is parsed
LOOK_AHEAD = 4


# An answer kept for a history (`answer` below) stops growing here: bounded memory, whatever the
# server sends (16 MiB of text is some 4M tokens, beyond any context).
ANSWER_MAX_CHARS = 16 << 20


@dataclass(slots=True)
class StreamState:
    """Accumulates one streamed response. All times are monotonic nanoseconds."""

    first_byte_ns: int | None = None
    first_token_ns: int | None = None
    first_content_ns: int | None = None
    token_chunk_ns: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    emulator_late_s: float | None = None  # the embedded emulator's own lateness (usage.kvbench_late_s)
    error: str | None = None
    done: bool = False
    finish_reason: str | None = None
    answer: list[str] | None = None  # the visible text, kept only when given a list
    answer_chars: int = 0
    fast: bool = True  # learn templates and take runs (False: parse every chunk, the tests' reference)
    template: Template | None = None
    _matched: Template | None = None  # the template `run_end` matched last (a Run's)
    _hits: int = 0  # chunks that fitted the template
    _learn_left: int = LEARN_TRIES

    def on_bytes(self, t_ns: int) -> None:
        if self.first_byte_ns is None:
            self.first_byte_ns = t_ns

    def on_events(self, events: list[SSEEvent | Run], t_ns: int) -> None:
        """Events (and runs of token chunks) whose bytes arrived at `t_ns`, in order; nothing
        after [DONE] counts."""
        for event in events:
            if self.done:
                return
            if type(event) is Run:
                self._on_run(event, t_ns)
            else:
                self.on_event(event, t_ns)  # type: ignore[arg-type]

    def on_event(self, event: SSEEvent, t_ns: int) -> None:
        data = event.data
        template = self.template
        if template is not None and template.fits(data) and (data.isascii() or _utf8(data)):
            self._hits += 1
            self._token(template.content, t_ns)
            if template.content and self.answer is not None:
                self._keep(template.text(data))
            return
        if len(data) < 16 and data.strip() == b"[DONE]":
            self.done = True
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.error = f"malformed SSE data: {data[:200]!r}"
            return
        if type(obj) is not dict:
            return
        if obj.get("error"):
            self.error = _error_text(obj["error"])
            return
        usage = obj.get("usage")
        if usage and type(usage) is dict:
            self._on_usage(usage)
        tokens = chunk_tokens(obj)
        if tokens.any_token:
            self._token(tokens.content, t_ns)
            if tokens.content and self.answer is not None:
                self._keep(content_of(obj))
            if self.fast and self._learn_left:
                self._learn(data, obj, tokens)
        finish = _finish_reason(obj)
        if finish is not None:
            self.finish_reason = finish

    def _learn(self, data: bytes, obj: dict[str, Any], tokens: ChunkTokens) -> None:
        if self._hits:
            self._learn_left, self._hits = LEARN_TRIES, 0
        elif self.template is not None:
            self._learn_left -= 1  # the last template fitted nothing
        self.template = learn(data, obj, tokens) if self._learn_left else None
        if self.template is None:
            self._learn_left = max(0, self._learn_left - 1)

    def run_end(self, buf: bytes, start: int) -> tuple[int, int]:
        """The decoder's `skip`: the run of events in `buf` that fit the template, from the event
        boundary `start` on: (first, end), first == end for none. Before the first token there is
        no template yet: the first token chunk among the next few events gives it, and the run
        starts there (the events before it are decoded as usual)."""
        first = start
        if self.template is None:
            if self.first_token_ns is not None or not self.fast or not self._learn_left:
                return start, start
            first = self._learn_ahead(buf, start)
        template = self.template
        if template is None:
            return start, start
        end = template.run_end(buf, first)
        if end == first:
            return start, start
        if not buf.isascii() and not _utf8(buf[first:end]):
            return start, start  # parsed one by one, to be refused as malformed
        self._matched = template
        return first, end

    def _learn_ahead(self, buf: bytes, start: int) -> int:
        """Learn the template from the first token chunk among the events from `start` (single
        `data: ` lines, at most LOOK_AHEAD of them); return where that chunk begins."""
        pos = start
        for _ in range(LOOK_AHEAD):
            end = buf.find(b"\n\n", pos)
            if end < 0 or buf[pos : pos + 6] != b"data: " or buf.find(b"\n", pos, end) >= 0:
                break
            data = buf[pos + 6 : end]
            try:
                obj = orjson.loads(data)
            except orjson.JSONDecodeError:
                break
            if type(obj) is not dict or obj.get("error"):
                break
            tokens = chunk_tokens(obj)
            if tokens.any_token:
                self._learn(data, obj, tokens)
                return pos
            pos = end + 2
        return start

    def _on_run(self, run: Run, t_ns: int) -> None:
        template = self._matched
        assert template is not None  # run_end matched it
        # one line and a blank one each (counting one byte is the faster count)
        self.take_run(template, run.buf, run.start, run.end, run.buf.count(b"\n", run.start, run.end) // 2, t_ns)

    def chunked_run_end(self, buf: bytes, start: int, frames: FramePatterns) -> int:
        """The end of the run of whole HTTP chunks from `start` that are each one token event
        fitting the template; `start` for none. `chunk_frames` checks the chunks' sizes and
        texts; then every chunk's prefix and suffix are the template's if each occurs once per
        chunk: "CRLF data: prefix" can only start at a size line's end, and "suffix LF LF CRLF"
        only end at a chunk's end (a plain text has no quote, CR or LF, and the prefix ends
        and the suffix begins with the text's quotes). The caller makes sure the SSE decoder is
        between events there, and takes the run (`take_run`)."""
        template = self.template
        if template is None or self.done:
            return start
        p, s = len(template.prefix), len(template.suffix)
        m = frames.get(p, s, False).match(buf, start)
        if m is None and buf[start : start + 1] in _UPPER_HEX:
            m = frames.get(p, s, True).match(buf, start)
        if m is None:
            return start
        end = m.end()
        n = buf.count(b"\n", start, end) // 4  # four a chunk: after its size, its event's two, after its data
        if (
            buf.count(b"\r\ndata: " + template.prefix, start, end) != n
            or buf.count(template.suffix + b"\n\n\r\n", start, end) != n
        ):
            return start  # another kind of event among them: decoded from the body
        if not buf.isascii() and not _utf8(buf[start:end]):
            return start  # decoded one by one, to be refused as malformed
        return end

    def take_run(self, template: Template, buf: bytes, start: int, end: int, n: int, t_ns: int) -> None:
        """`n` token events of `template`, found in buf[start:end] (with or without their HTTP
        chunks' framing), arrived at t_ns."""
        self._token(template.content, t_ns)
        self._hits += n
        self.token_chunk_ns += [t_ns] * (n - 1)
        if template.content and self.answer is not None:
            self._keep(template.texts(buf, start, end).decode())

    def _token(self, content: bool, t_ns: int) -> None:
        """A token chunk (content: with visible text) arrived at t_ns."""
        if self.first_token_ns is None:
            self.first_token_ns = t_ns
        self.token_chunk_ns.append(t_ns)
        if content and self.first_content_ns is None:
            self.first_content_ns = t_ns

    def _keep(self, text: str) -> None:
        """Add visible text to the answer, up to its bound."""
        if self.answer is not None and self.answer_chars < ANSWER_MAX_CHARS:
            text = text[: ANSWER_MAX_CHARS - self.answer_chars]
            self.answer.append(text)
            self.answer_chars += len(text)

    def _on_usage(self, usage: dict[str, Any]) -> None:
        # Later usage chunks (continuous usage stats) supersede earlier ones. A count is a whole
        # number of at least 0 (a bool is not one): anything else is not taken.
        if _count(usage.get("prompt_tokens")):
            self.prompt_tokens = usage["prompt_tokens"]
        if _count(usage.get("completion_tokens")):
            self.completion_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if type(details) is dict and _count(details.get("cached_tokens")):
            self.cached_tokens = details["cached_tokens"]
        late = usage.get(EMULATOR_LATE_KEY)
        if isinstance(late, int | float) and not isinstance(late, bool) and math.isfinite(late) and late >= 0:
            self.emulator_late_s = float(late)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _error_text(err: Any) -> str:
    """An error event's text, whole: the client takes secrets out and then cuts it (client.py)."""
    if isinstance(err, dict):
        msg = err.get("message") or json.dumps(err)
        code = err.get("code") or err.get("type")
        return f"{code}: {msg}" if code else str(msg)
    return str(err)
