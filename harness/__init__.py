"""kvbench: measure how much a shared KV-cache storage tier speeds up LLM inference."""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from harness.analysis.frames import Runs


def load(paths: str | Path | list[str | Path]) -> Runs:
    """Result folders (or globs of them) as DataFrames: `.requests()`, `.summary()`,
    `.by_length()` (harness/analysis/frames.py). pandas is loaded here, never on the run path.
    Raises InputError (harness/core/errors.py) for a folder that is not a readable result."""
    from harness.analysis.frames import load as load_frames

    return load_frames(paths)
