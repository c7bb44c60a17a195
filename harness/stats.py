"""Summary figures from per-request records (plain dicts as in requests.jsonl). Pure functions.

Definitions:
- TTFT: request start -> first token (content, reasoning or tool call).
- req/s: completed requests / (last end - first start), as the Redbooks paper defines it.
- speedup at a length: median cold TTFT / median warm TTFT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

Record = dict[str, Any]


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method), None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "count": len(values),
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def _ok(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if r.get("ok")]


def ttfts(records: Iterable[Record]) -> list[float]:
    return [r["ttft_s"] for r in _ok(records) if r.get("ttft_s") is not None]


def req_per_s(records: Sequence[Record]) -> float | None:
    done = _ok(records)
    if not done:
        return None
    first_start = min(r["start_s"] for r in records)
    last_end = max(r["start_s"] + r["e2e_s"] for r in done)
    span = last_end - first_start
    return len(done) / span if span > 0 else None


def sweep_rows(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per prompt length: cold and warm TTFT medians and the speedup."""
    lengths = sorted({r["target_tokens"] for r in records if r.get("target_tokens") is not None})
    rows = []
    for n in lengths:
        at = [r for r in records if r.get("target_tokens") == n]
        cold = ttfts(r for r in at if r["phase"] == "cold")
        warm = ttfts(r for r in at if r["phase"] == "warm")
        c50, w50 = percentile(cold, 50), percentile(warm, 50)
        rows.append(
            {
                "length": n,
                "cold_n": len(cold),
                "warm_n": len(warm),
                "cold_ttft_p50_s": c50,
                "warm_ttft_p50_s": w50,
                "speedup": c50 / w50 if c50 is not None and w50 else None,
            }
        )
    return rows


def summary(records: Sequence[Record], kind: str) -> dict[str, Any]:
    ok = _ok(records)
    out: dict[str, Any] = {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "ttft_s": describe(ttfts(records)),
        "e2e_s": describe([r["e2e_s"] for r in ok]),
    }
    if kind == "sweep":
        out["by_length"] = sweep_rows(records)
    else:
        out["req_per_s"] = req_per_s(records)
        done_tokens = sum(r.get("completion_tokens") or 0 for r in ok)
        span = max(r["start_s"] + r["e2e_s"] for r in ok) - min(r["start_s"] for r in records) if ok else 0.0
        out["output_tokens_per_s"] = done_tokens / span if span > 0 else None
        out["duration_s"] = span or None
    return out


def mann_whitney_p(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation with tie correction,
    continuity-corrected); None when either sample has fewer than 2 values."""
    n1, n2 = len(x), len(y)
    if n1 < 2 or n2 < 2:
        return None
    pooled = sorted([(v, 0) for v in x] + [(v, 1) for v in y])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    r1 = sum(r for r, (_, g) in zip(ranks, pooled, strict=True) if g == 0)
    u = r1 - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u - mu) - 0.5) / sigma
    return max(0.0, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2))))


def drop(before: float, after: float) -> dict[str, float]:
    """Ratio and percentage drop from `before` to `after` (e.g. req/s clean vs with traffic)."""
    return {"ratio": after / before, "drop_pct": (before - after) / before * 100.0}
