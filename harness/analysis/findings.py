"""The report's derived analyses, recomputed from request records: per-group statistics, the
cost-model fit, cache verification and the claims audit. Every figure comes from the one
statistics core (stats.py); published figures come from the reference file.

Cost model: recompute TTFT(n) = a*n + b*n^2 (least squares on cold requests); load TTFT(n) =
c + n/r (least squares on warm requests); bandwidth = r * kv_bytes_per_token; break-even = the
length below which recomputing is faster than loading.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.analysis import stats
from harness.results import RequestRecord
from harness.server import checks

Records = Sequence[RequestRecord]
GROUP_METRICS = ("ttft_s", "first_byte_s", "e2e_s", "itl_s")


# Beyond this many distinct prompt lengths (a trace's, a drawn distribution's), the group tables
# bin lengths by powers of two instead of a row per length
MAX_LENGTH_GROUPS = 12


def length_bin(tokens: int | None) -> tuple[int, int] | None:
    """The power-of-two bin [lo, hi] a prompt length falls in."""
    if tokens is None or tokens < 1:
        return None
    lo = 1 << (tokens.bit_length() - 1)
    return lo, 2 * lo - 1


def group_stats(records: Records, by: Sequence[str] = ("arm", "phase", "target_tokens")) -> list[dict[str, Any]]:
    """Per group: count, errors, mean/p50/p90/p99 of each metric, and intervals of the TTFT
    median and mean (stats.interval). With more than MAX_LENGTH_GROUPS distinct lengths, `target_tokens`
    groups are power-of-two bins (`tokens_bin` [lo, hi], `target_tokens` None); `tokens` says
    which, as text."""
    binned = "target_tokens" in by and len({r.target_tokens for r in records}) > MAX_LENGTH_GROUPS
    if binned:
        grouped: dict[tuple[Any, ...], list[RequestRecord]] = {}
        for r in records:
            key = tuple(length_bin(r.target_tokens) if k == "target_tokens" else getattr(r, k) for k in by)
            grouped.setdefault(key, []).append(r)
        items = sorted(grouped.items(), key=lambda kv: tuple((v is None, v) for v in kv[0]))
    else:
        items = list(stats.groups(records, by).items())
    rows = []
    for key, g in items:
        row: dict[str, Any] = dict(zip(by, key, strict=True))
        if binned:
            row["tokens_bin"], row["target_tokens"] = row["target_tokens"], None
            lo_hi = row["tokens_bin"]
            row["tokens"] = "-" if lo_hi is None else f"{lo_hi[0]:,}-{lo_hi[1]:,}"
        elif "target_tokens" in row:
            row["tokens"] = "-" if row["target_tokens"] is None else f"{row['target_tokens']:,}"
        row["count"] = len(g)
        row["errors"] = sum(not r.ok for r in g)
        for m in GROUP_METRICS:
            d = stats.describe(stats.values(g, m))
            for name in ("mean", "p50", "p90", "p99"):
                row[f"{m}_{name}"] = d[name]
        ttft = stats.values(g, "ttft_s")
        for name in stats.STATISTICS:
            ci = stats.interval(ttft, name)
            row[f"ttft_s_{name}_ci_lo"], row[f"ttft_s_{name}_ci_hi"] = ci if ci else (None, None)
        rows.append(row)
    return rows


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


def _fit_points(records: Records, phase: str) -> tuple[np.ndarray, np.ndarray, int]:
    rows = [r for r in records if r.ok and r.ttft_s is not None and r.phase == phase]
    n = np.asarray([float(r.prompt_tokens if r.prompt_tokens is not None else r.target_tokens or 0) for r in rows])
    t = np.asarray([float(r.ttft_s or 0.0) for r in rows])
    return n, t, len({r.target_tokens for r in rows})


def fit_prefill(records: Records) -> tuple[float, float] | None:
    """The recompute cost model, a*n + b*n^2 s for an n-token prompt, fitted to the cold requests'
    TTFTs by least squares; None without cold requests at two or more lengths."""
    return _prefill(*_fit_points(records, "cold"))


def _prefill(n: np.ndarray, t: np.ndarray, lengths: int) -> tuple[float, float] | None:
    if lengths < 2:
        return None
    (a, b), *_ = np.linalg.lstsq(np.column_stack([n, n * n]), t, rcond=None)
    return float(a), float(b)


def fit_cost_model(records: Records, kv_bytes_per_token: int) -> CostFit | None:
    """Least-squares fits of the recompute and load cost models; None without both phases at two
    or more lengths. Residuals are per request (measured - fitted)."""
    nc, tc, cold_lengths = _fit_points(records, "cold")
    nw, tw, warm_lengths = _fit_points(records, "warm")
    prefill = _prefill(nc, tc, cold_lengths)
    if prefill is None or warm_lengths < 2:
        return None
    a, b = prefill
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


def restores(records: Records) -> dict[str, Any] | None:
    """Requests whose KV the engine restored from a file first (`warm_from = "disk"`): per
    length, what it read and how fast, the warm TTFT with the restore added (the load path's
    whole cost), and a least-squares fit restore_s = c + bytes / r over them. None without any."""
    done = [r for r in records if r.ok and r.restore_s is not None and r.restore_bytes]
    if not done:
        return None
    rows = []
    for (n,), g in sorted(stats.groups(done, ("target_tokens",)).items(), key=lambda kv: kv[0][0] or 0):
        secs = [r.restore_s or 0.0 for r in g]
        rates = [(r.restore_bytes or 0) / t for r, t in zip(g, secs, strict=True) if t > 0]
        rows.append(
            {
                "length": n,
                "n": len(g),
                "tokens": int(np.median([r.restore_tokens or 0 for r in g])),
                "bytes": int(np.median([r.restore_bytes or 0 for r in g])),
                "restore_s_p50": float(np.median(secs)),
                "gb_per_s_p50": float(np.median(rates)) / 1e9 if rates else None,
                "warm_ttft_s_p50": stats.percentile(stats.values(g, "request_ttft_s"), 50),
                "with_restore_s_p50": stats.percentile(stats.values(g, "ttft_s"), 50),
            }
        )
    per_token = [(r.restore_bytes or 0) / r.restore_tokens for r in done if r.restore_tokens]
    out: dict[str, Any] = {
        "rows": rows,
        "kv_bytes_per_token": float(np.median(per_token)) if per_token else None,
        "c_s": None,
        "gb_per_s": None,
    }
    sizes = np.asarray([float(r.restore_bytes or 0) for r in done])
    if len(set(sizes.tolist())) >= 2:
        (c, slope), *_ = np.linalg.lstsq(
            np.column_stack([np.ones_like(sizes), sizes]), np.asarray([r.restore_s or 0.0 for r in done]), rcond=None
        )
        out["c_s"], out["gb_per_s"] = float(c), (1.0 / float(slope) / 1e9 if slope > 0 else None)
    return out


def _shares(records: Records) -> list[float]:
    return [r.cached_tokens / r.prompt_tokens for r in records if r.cached_tokens is not None and r.prompt_tokens]


def cache_verification(records: Records, cold_allowance: int = 0, block: int | None = None) -> dict[str, Any]:
    """Were warm requests served from cache, and were cold ones cold?"""
    done = stats.ok(records)
    warm = [r for r in done if r.phase == "warm"]
    cold = [r for r in done if r.phase == "cold"]
    reported = [r for r in warm if r.cached_tokens is not None and r.prompt_tokens is not None]
    share = _shares(reported)
    loop = [r for r in done if r.phase == "run" and r.cached_tokens is not None and r.prompt_tokens is not None]
    loop_share = _shares(loop)
    return {
        "loop_requests": len(loop),
        "loop_mean_cached_share": float(np.mean(loop_share)) if loop_share else None,
        "loop_hits": sum(s > 0 for s in loop_share),
        "warm_requests": len(warm),
        "warm_reported": len(reported),
        "warm_served_from_cache": sum(
            checks.warm_hit(r.cached_tokens or 0, r.prompt_tokens or 0, block) for r in reported if r.prompt_tokens
        ),
        "warm_mean_cached_share": float(np.mean(share)) if share else None,
        "cold_requests": len(cold),
        "cold_not_cold": sum(r.cached_tokens is not None and r.cached_tokens > cold_allowance for r in cold),
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
    t, cc, ct, claims = ref["ttft"], ref["concurrency"], ref["competing_traffic"], ref["claims"]
    n_max = int(t["prompt_tokens_max"])
    cold_max, warm_max = float(t["no_cache_s"][str(n_max)]), float(t["cached_s_range"][1])
    rec, cac, tra = (float(x["req_per_s"]) for x in (cc["recompute"], cc["cached"], ct["cached"]))
    rec_t, cac_t, tra_t = (float(x["total_s"]) for x in (cc["recompute"], cc["cached"], ct["cached"]))
    n = int(cc["requests"])
    rows: list[tuple[str, str, float, str, str, str]] = [
        (
            f"TTFT speedup at {n_max // 1000}K tokens",
            str(claims["ttft_speedup"]),
            cold_max / warm_max,
            f"{cold_max} / {warm_max}",
            "ttft_speedup_max",
            "x",
        ),
        ("Recompute throughput", f"{rec:g}", n / rec_t, f"{n} / {rec_t:g} s", "recompute_req_per_s", "req/s"),
        ("Cached throughput", f"{cac:g}", n / cac_t, f"{n} / {cac_t:g} s", "cached_req_per_s", "req/s"),
        (
            "Concurrency speedup (cached vs recompute)",
            str(claims["concurrency_speedup"]),
            cac / rec,
            f"{cac} / {rec}",
            "concurrency_speedup",
            "x",
        ),
        (
            "Throughput with competing traffic",
            f"{tra:g}",
            n / tra_t,
            f"{n} / {tra_t:g} s",
            "traffic_req_per_s",
            "req/s",
        ),
        (
            "Throughput drop under competing traffic",
            str(claims["traffic_drop_pct"]),
            (cac - tra) / cac * 100,
            f"({cac} - {tra}) / {cac}",
            "traffic_drop_pct",
            "%",
        ),
        (
            "Competing traffic vs recompute",
            f"{tra / rec:.1f} (not claimed)",
            tra / rec,
            f"{tra} / {rec}",
            "traffic_vs_recompute",
            "x",
        ),
    ]
    out = []
    for name, text, recomputed, how, key, unit in rows:
        pub = float(text.split()[0])
        flag = None
        if abs(pub - recomputed) > _half_unit(text.split()[0]) + 1e-9:
            pct = unit if unit == "%" else ""
            flag = f"published {text}{pct} but the published inputs give {recomputed:.3g}{pct}"
            if key == "traffic_drop_pct":
                flag += f"; {tra} / {rec} = {tra / rec:.1f}x suggests the {text} may be a ratio to recompute"
        out.append(Claim(name, text, pub, recomputed, how, measured.get(key), unit, flag))
    return out
