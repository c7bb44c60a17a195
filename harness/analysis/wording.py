"""How figures are written (pure): numbers (one formatter for the report, `compare`, the CLI and
the kinds' report sections), a schedule's lag, the share served from cache."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.analysis.stats import EMULATOR_LATE_SHARE

# What a figure the emulator ran late in means (stats.emulator_late_share)
LATE_ROWS = (
    f"the emulator sent first tokens later than its model by more than {EMULATOR_LATE_SHARE:.0%} of the "
    "modelled TTFT (median) there, so those figures are not the model's; run at a lower --time-scale"
)


def late_rows(rows: list[dict[str, Any]]) -> str:
    """The sweep rows the emulator ran late in, with how late in each phase, e.g. "100,000 tokens
    (cold 1 %, warm 21 %)"; "" where none."""

    def phases(row: dict[str, Any]) -> str:
        shares = ((p, row.get(f"{p}_emulator_late_share")) for p in ("cold", "warm"))
        return ", ".join(f"{p} {v:.0%}" for p, v in shares if v is not None)

    return ", ".join(f"{row['length']:,} tokens ({phases(row)})" for row in rows if row.get("emulator_late"))


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


def num(x: Any, digits: int = 3) -> str:
    """A number as the report shows it: integers whole with thousands separators, others to
    `digits` significant digits (whole from 1,000 up); "-" for none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"
