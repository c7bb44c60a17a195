"""Derived figures, recomputed from per-request records. Pure functions over pandas frames.

Definitions (also shown in reports):
- TTFT: request start (headers on the socket) -> first token-bearing chunk.
- speedup at a length: median cold TTFT / median warm TTFT; its 95 % interval comes from a
  bootstrap that resamples cold and warm requests independently.
- req/s: completed requests / (last end - first start), as the Redbooks paper defines it.
- steady-state req/s: completions between the 10th and 90th percentile of end times, divided by
  that span: ramp-up and drain excluded.
- drop: (before - after) / before.
- cost model: recompute TTFT(n) = a*n + b*n^2 (least squares on cold requests); load TTFT(n) =
  c + n/r (least squares on warm requests); bandwidth = r * kv_bytes_per_token; break-even = the
  length below which recomputing is faster than loading.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.stats import drop  # noqa: F401  (re-exported: part of the analysis API)

METRICS = ("ttft_s", "first_byte_s", "e2e_s", "itl_s")
WARM_SERVED_SHARE = 0.9


def frame(records: Sequence[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame.from_records(list(records))
    for col in ("ok", "phase", "arm", "target_tokens", "prompt_tokens", "cached_tokens", "start_s", "e2e_s", "ttft_s"):
        if col not in df:
            df[col] = pd.Series(dtype=object)
    df["end_s"] = df["start_s"] + df["e2e_s"]
    return df


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Callable[[np.ndarray], Any] = np.median,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of `stat`; None with fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return None
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, len(x), size=(n_boot, len(x)))]
    stats = np.asarray(stat(samples, axis=1)) if stat in (np.median, np.mean) else np.array([stat(s) for s in samples])
    lo, hi = np.quantile(stats, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def _describe(x: np.ndarray) -> dict[str, float | None]:
    if len(x) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    q = np.quantile(x, [0.5, 0.9, 0.99])
    return {"mean": float(x.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def _values(df: pd.DataFrame, metric: str) -> np.ndarray:
    ok = df[df["ok"] == True]  # noqa: E712 (a column of objects)
    if metric == "itl_s":
        if "itl_s" not in ok:
            return np.array([])
        return np.array([v for lst in ok["itl_s"] if isinstance(lst, list) for v in lst], dtype=float)
    return ok[metric].dropna().to_numpy(dtype=float)


def group_stats(df: pd.DataFrame, by: Sequence[str] = ("arm", "phase", "target_tokens")) -> pd.DataFrame:
    """Per group: count, errors, mean/p50/p90/p99 of each metric, 95 % bootstrap intervals of the
    TTFT median and mean."""
    rows = []
    keys = [k for k in by if k in df]
    for key, g in df.groupby(keys, dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        row: dict[str, Any] = dict(zip(keys, key, strict=True))
        row["count"] = len(g)
        row["errors"] = int((g["ok"] != True).sum())  # noqa: E712
        for m in METRICS:
            for stat, v in _describe(_values(g, m)).items():
                row[f"{m}_{stat}"] = v
        ttft = _values(g, "ttft_s")
        for name, fn in (("p50", np.median), ("mean", np.mean)):
            ci = bootstrap_ci(ttft, fn)
            row[f"ttft_s_{name}_ci_lo"], row[f"ttft_s_{name}_ci_hi"] = ci if ci else (None, None)
        rows.append(row)
    return pd.DataFrame(rows)


def speedup_table(df: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """Per prompt length: cold and warm median TTFT, speedup = cold / warm, and its interval."""
    rows = []
    rng = np.random.default_rng(seed)
    for n, g in df.groupby("target_tokens", sort=True):
        cold, warm = _values(g[g["phase"] == "cold"], "ttft_s"), _values(g[g["phase"] == "warm"], "ttft_s")
        row: dict[str, Any] = {"length": int(n), "cold_n": len(cold), "warm_n": len(warm)}
        row["cold_p50_s"] = float(np.median(cold)) if len(cold) else None
        row["warm_p50_s"] = float(np.median(warm)) if len(warm) else None
        row["speedup"] = row["cold_p50_s"] / row["warm_p50_s"] if row["cold_p50_s"] and row["warm_p50_s"] else None
        row["speedup_ci_lo"] = row["speedup_ci_hi"] = None
        if len(cold) >= 2 and len(warm) >= 2:
            c = np.median(cold[rng.integers(0, len(cold), (2000, len(cold)))], axis=1)
            w = np.median(warm[rng.integers(0, len(warm), (2000, len(warm)))], axis=1)
            lo, hi = np.quantile(c / w, [0.025, 0.975])
            row["speedup_ci_lo"], row["speedup_ci_hi"] = float(lo), float(hi)
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class ClosedLoop:
    completed: int
    failed: int
    req_per_s: float | None
    steady_req_per_s: float | None
    output_tok_per_s: float | None
    duration_s: float | None
    mean_concurrency: float | None
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (time, requests in flight)


def closed_loop(df: pd.DataFrame) -> ClosedLoop:
    ok = df[df["ok"] == True]  # noqa: E712
    failed = len(df) - len(ok)
    if ok.empty:
        return ClosedLoop(0, failed, None, None, None, None, None)
    first, last = float(df["start_s"].min()), float(ok["end_s"].max())
    span = last - first
    ends = np.sort(ok["end_s"].to_numpy(dtype=float))
    lo, hi = np.quantile(ends, [0.1, 0.9])
    inside = int(((ends > lo) & (ends <= hi)).sum())
    steady = inside / (hi - lo) if hi > lo else None
    tokens = float(ok["completion_tokens"].fillna(0).sum()) if "completion_tokens" in ok else 0.0
    events = sorted([(float(t), 1) for t in df["start_s"]] + [(float(t), -1) for t in df["end_s"].dropna()])
    timeline, level, area, prev = [], 0, 0.0, first
    for t, d in events:
        area += level * (t - prev)
        level += d
        prev = t
        timeline.append((t, level))
    return ClosedLoop(
        completed=len(ok),
        failed=failed,
        req_per_s=len(ok) / span if span > 0 else None,
        steady_req_per_s=steady,
        output_tok_per_s=tokens / span if span > 0 else None,
        duration_s=span,
        mean_concurrency=area / span if span > 0 else None,
        timeline=timeline,
    )


@dataclass(frozen=True)
class CostFit:
    a: float  # s per token (recompute)
    b: float  # s per token^2 (recompute)
    c: float  # s (load: fixed latency)
    s_per_token: float  # s per token (load)
    tokens_per_s: float
    bandwidth_gb_s: float
    break_even_tokens: float | None
    residuals: list[dict[str, Any]]


def fit_cost_model(df: pd.DataFrame, kv_bytes_per_token: int) -> CostFit | None:
    """Least-squares fits of the recompute and load cost models; None without both phases at two
    or more lengths. Residuals are per request (measured - fitted)."""
    ok = df[(df["ok"] == True) & df["ttft_s"].notna()]  # noqa: E712
    n_col = ok["prompt_tokens"].fillna(ok["target_tokens"]).astype(float)
    cold, warm = ok[ok["phase"] == "cold"], ok[ok["phase"] == "warm"]
    if cold["target_tokens"].nunique() < 2 or warm["target_tokens"].nunique() < 2:
        return None
    nc, tc = n_col[cold.index].to_numpy(), cold["ttft_s"].to_numpy(dtype=float)
    (a, b), *_ = np.linalg.lstsq(np.column_stack([nc, nc * nc]), tc, rcond=None)
    nw, tw = n_col[warm.index].to_numpy(), warm["ttft_s"].to_numpy(dtype=float)
    (c, s), *_ = np.linalg.lstsq(np.column_stack([np.ones_like(nw), nw]), tw, rcond=None)
    rate = 1.0 / s if s > 0 else math.inf
    # a*n + b*n^2 = c + s*n  ->  b*n^2 + (a - s)*n - c = 0: the positive root.
    disc = (a - s) ** 2 + 4 * b * c
    be = (-(a - s) + math.sqrt(disc)) / (2 * b) if b > 0 and disc >= 0 else None
    residuals = [
        {"phase": "cold", "tokens": float(n), "measured_s": float(t), "fitted_s": float(a * n + b * n * n)}
        for n, t in zip(nc, tc, strict=True)
    ] + [
        {"phase": "warm", "tokens": float(n), "measured_s": float(t), "fitted_s": float(c + s * n)}
        for n, t in zip(nw, tw, strict=True)
    ]
    return CostFit(float(a), float(b), float(c), float(s), rate, rate * kv_bytes_per_token / 1e9, be, residuals)


def cache_verification(df: pd.DataFrame, template_allowance: int = 0) -> dict[str, Any]:
    """Were warm requests served from cache, and were cold ones cold?"""
    ok = df[df["ok"] == True]  # noqa: E712
    warm, cold = ok[ok["phase"] == "warm"], ok[ok["phase"] == "cold"]
    reported = warm[warm["cached_tokens"].notna() & warm["prompt_tokens"].notna()]
    share = reported["cached_tokens"].astype(float) / reported["prompt_tokens"].astype(float)
    cold_rep = cold[cold["cached_tokens"].notna()]
    loop = ok[(ok["phase"] == "run") & ok["cached_tokens"].notna() & ok["prompt_tokens"].notna()]
    loop_share = loop["cached_tokens"].astype(float) / loop["prompt_tokens"].astype(float)
    return {
        "loop_requests": len(loop),
        "loop_mean_cached_share": float(loop_share.mean()) if len(loop) else None,
        "loop_hits": int((loop_share > 0).sum()),
        "warm_requests": len(warm),
        "warm_reported": len(reported),
        "warm_served_from_cache": int((share >= WARM_SERVED_SHARE).sum()),
        "warm_mean_cached_share": float(share.mean()) if len(share) else None,
        "cold_requests": len(cold),
        "cold_not_cold": int((cold_rep["cached_tokens"].astype(float) > template_allowance).sum()),
    }


@dataclass(frozen=True)
class Claim:
    name: str
    published: str
    published_value: float
    recomputed: float
    recomputed_from: str
    measured: float | None
    unit: str
    flag: str | None  # why published and recomputed disagree beyond rounding


def _half_unit(text: str) -> float:
    """Half a unit of the last digit given: the rounding a published figure allows."""
    digits = text.split(".")[1] if "." in text else ""
    return 0.5 * 10 ** (-len(digits))


def claims_audit(ref: dict[str, Any], measured: dict[str, float | None]) -> list[Claim]:
    """Each published derived figure: as published, recomputed from the published inputs, measured."""
    t, cc, ct = ref["ttft"], ref["concurrency"], ref["competing_traffic"]
    cold130, warm130 = float(t["no_cache_s"]["130000"]), float(t["cached_s_range"][1])
    rec, cac, tra = (float(x["req_per_s"]) for x in (cc["recompute"], cc["cached"], ct["cached"]))
    rec_t, cac_t, tra_t = (float(x["total_s"]) for x in (cc["recompute"], cc["cached"], ct["cached"]))
    n = int(cc["requests"])
    rows: list[tuple[str, str, float, float, str, str, str]] = [
        (
            "TTFT speedup at 130K tokens",
            "56",
            56.0,
            cold130 / warm130,
            f"{cold130} / {warm130}",
            "ttft_speedup_130k",
            "x",
        ),
        ("Recompute throughput", "0.19", 0.19, n / rec_t, f"{n} / {rec_t:g} s", "recompute_req_per_s", "req/s"),
        ("Cached throughput", "4.26", 4.26, n / cac_t, f"{n} / {cac_t:g} s", "cached_req_per_s", "req/s"),
        (
            "Concurrency speedup (cached vs recompute)",
            "22",
            22.0,
            cac / rec,
            f"{cac} / {rec}",
            "concurrency_speedup",
            "x",
        ),
        (
            "Throughput with competing traffic",
            "3.6",
            3.6,
            n / tra_t,
            f"{n} / {tra_t:g} s",
            "traffic_req_per_s",
            "req/s",
        ),
        (
            "Throughput drop under competing traffic",
            "18",
            18.0,
            (cac - tra) / cac * 100,
            f"({cac} - {tra}) / {cac}",
            "traffic_drop_pct",
            "%",
        ),
        (
            "Competing traffic vs recompute",
            "18.9 (not claimed)",
            18.9,
            tra / rec,
            f"{tra} / {rec}",
            "traffic_vs_recompute",
            "x",
        ),
    ]
    out = []
    for name, text, pub, recomputed, how, key, unit in rows:
        flag = None
        if abs(pub - recomputed) > _half_unit(text.split()[0]) + 1e-9:
            pct = unit if unit == "%" else ""
            flag = f"published {text}{pct} but the published inputs give {recomputed:.3g}{pct}"
            if key == "traffic_drop_pct":
                flag += f"; {tra} / {rec} = {tra / rec:.1f}x suggests the 18 may be a ratio to recompute"
        out.append(Claim(name, text, pub, recomputed, how, measured.get(key), unit, flag))
    return out
