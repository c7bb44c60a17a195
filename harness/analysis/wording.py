"""How a summary's figures are written in a terminal line (pure): numbers, a schedule's lag, the
share served from cache."""

from __future__ import annotations

from typing import Any


def cached_lines(s: dict[str, Any]) -> list[str]:
    """The share of prompt tokens served from cache, against what an infinite cache could, where
    a summary has it."""
    if s.get("cached_share") is None:
        return []
    line = f"prompt tokens served from cache: {s['cached_share']:.1%}"
    if possible := s.get("possible_cached_share"):
        line += f" of the {possible:.1%} an infinite cache could (captured {s['cached_share'] / possible:.0%})"
    return [line]


def sent(lag: dict[str, Any]) -> str:
    return (
        f"sent {fmt(lag['sent_req_per_s'], 3)} of {fmt(lag['intended_req_per_s'], 3)} req/s intended, "
        f"schedule lag p99 {_ms(lag['p99_s'])}"
    )


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f} ms"


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
