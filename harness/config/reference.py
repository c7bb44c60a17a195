"""The published figures (IBM Redbooks MD260021), from the project's own copy of
`shared/reference/redbooks-md260021.toml`. Everything calibrated to the paper, and every
published figure a report, audit or message shows, reads them here and nowhere else."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any


@cache
def redbooks() -> dict[str, Any]:
    text = resources.files("harness").joinpath("reference/redbooks-md260021.toml").read_text("utf-8")
    return tomllib.loads(text)


def kv_bytes_per_token() -> int:
    """gpt-oss-120b's KV bytes per token: the default of a scenario's [model] table."""
    return int(redbooks()["model_kv"]["kv_bytes_per_token"])


def ttft_speedup_length() -> int:
    """The prompt length of the published TTFT speedup (the sweep's longest)."""
    return int(redbooks()["ttft"]["prompt_tokens_max"])


def req_per_s(test: str | None, arm: str) -> float | None:
    """The published req/s that a (reference test, arm) run reproduces, if any."""
    ref = redbooks()
    if test == "concurrency" and arm in ("recompute", "cached"):
        return float(ref["concurrency"][arm]["req_per_s"])
    if test == "competing_traffic" and arm == "traffic":
        return float(ref["competing_traffic"]["cached"]["req_per_s"])
    if test == "competing_traffic" and arm == "clean":
        return float(ref["concurrency"]["cached"]["req_per_s"])
    return None


def traffic_drop() -> dict[str, float | str]:
    """The published competing-traffic figures: before, after, the drop they give, the claim."""
    ref = redbooks()
    before = float(ref["concurrency"]["cached"]["req_per_s"])
    after = float(ref["competing_traffic"]["cached"]["req_per_s"])
    return {
        "before": before,
        "after": after,
        "drop_pct": (before - after) / before * 100,
        "claimed_pct": str(ref["claims"]["traffic_drop_pct"]),
    }
