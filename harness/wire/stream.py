"""What an OpenAI-compatible streaming response says, and when: the one place that decides
which chunk is the first token.

Pure logic: `StreamState.on_event(event, t_ns)` is fed every SSE event with the monotonic time
at which the bytes carrying it arrived. The first token is the first chunk with a non-empty
`content`, `reasoning`, `reasoning_content`, tool call, or completions `text`. A role-only
chunk, an empty string and a usage chunk are not tokens and never move the first-token time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from harness.wire.sse import SSEEvent


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
    error: str | None = None
    done: bool = False
    finish_reason: str | None = None
    answer: list[str] | None = None  # the visible text, kept only when given a list
    answer_chars: int = 0

    def on_bytes(self, t_ns: int) -> None:
        if self.first_byte_ns is None:
            self.first_byte_ns = t_ns

    def on_event(self, event: SSEEvent, t_ns: int) -> None:
        data = event.data
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
            if self.first_token_ns is None:
                self.first_token_ns = t_ns
            self.token_chunk_ns.append(t_ns)
            if tokens.content:
                if self.first_content_ns is None:
                    self.first_content_ns = t_ns
                if self.answer is not None and self.answer_chars < ANSWER_MAX_CHARS:
                    text = content_of(obj)[: ANSWER_MAX_CHARS - self.answer_chars]
                    self.answer.append(text)
                    self.answer_chars += len(text)
        choices = obj.get("choices")
        if choices and type(choices) is list:
            for choice in choices:
                if type(choice) is dict and choice.get("finish_reason"):
                    self.finish_reason = str(choice["finish_reason"])

    def _on_usage(self, usage: dict[str, Any]) -> None:
        # Later usage chunks (continuous usage stats) supersede earlier ones.
        if isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            self.completion_tokens = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            self.cached_tokens = details["cached_tokens"]


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        msg = err.get("message") or json.dumps(err)[:500]
        code = err.get("code") or err.get("type")
        return f"{code}: {msg}" if code else str(msg)
    return str(err)[:500]
