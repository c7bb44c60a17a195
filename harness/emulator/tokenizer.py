"""The emulator's tokenizer: words and punctuation marks, plus a chat template that adds tokens
of its own, so that the client's exact-length logic is really exercised."""

from __future__ import annotations

import re
from typing import Any

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def count(text: str) -> int:
    return sum(1 for _ in _TOKEN_RE.finditer(text))


def message_text(content: Any) -> str:
    """OpenAI message content: a string, or a list of parts of which the text ones count."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def render_chat(messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """A harmony-like template: each message costs 16 tokens beyond its content (the role is one
    of them), and the generation prompt 6 more."""
    parts = [f"<|start|>{m.get('role', 'user')}<|message|>{message_text(m.get('content'))}<|end|>" for m in messages]
    if add_generation_prompt:
        parts.append("<|start|>assistant")
    return "\n".join(parts)
