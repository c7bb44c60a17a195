"""The longest prompt (with its output) a run may send: the model's context as a scenario gives
it, or as an engine kvbench starts knows it better (config/engines.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

# The default bound on any prompt's length (model.max_context_tokens): the longest contexts models
# are served with today, and what kvbench may hold of one prompt (about 4 MB of text). Lengths
# beyond it are refused before anything is built or sent.
MAX_CONTEXT_TOKENS = 1 << 20


@dataclass(frozen=True)
class Context:
    """The longest prompt (with its output) a run may send, and where that bound comes from."""

    tokens: int = MAX_CONTEXT_TOKENS
    source: str = "model.max_context_tokens"

    @classmethod
    def of(cls, sc: Scenario) -> Context:
        return cls(sc.model.max_context_tokens)
