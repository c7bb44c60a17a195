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
from harness.results import RequestRecord, Table
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


def group_stats(
    records: Records, by: Sequence[str] = ("arm", "phase", "target_tokens"), gaps_held: int = stats.GAPS_HELD
) -> list[dict[str, Any]]:
    """Per group: count, errors, mean/p50/p90/p99 of each metric, and intervals of the TTFT
    median and mean (stats.interval); ITL from at most about `gaps_held` gaps of the group's
    (`itl_every`: 1, or k where from those of one request in k). With more than
    MAX_LENGTH_GROUPS distinct lengths, `target_tokens` groups are power-of-two bins (`tokens_bin`
    [lo, hi], `target_tokens` None); `tokens` says which, as text."""
    t = Table.of(records)
    binned = "target_tokens" in by and len(stats.distinct(t, "target_tokens")[0]) > MAX_LENGTH_GROUPS
    items = list(stats.groups(t, by, {"target_tokens": length_bin} if binned else None).items())
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
        row["errors"] = int((~g.ok).sum())
        done = stats.ok(g)
        row["itl_every"] = stats.gaps_every(done, gaps_held)
        for m in GROUP_METRICS:
            d = stats.describe(stats.gaps(done, held=gaps_held) if m == "itl_s" else stats.values(g, m))
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
    done = stats.ok(records)
    rows = done.where(~np.isnan(done.numbers("ttft_s")) & done.text_is("phase", phase))
    n = np.nan_to_num(stats.context_tokens(rows))
    return n, rows.numbers("ttft_s"), len(stats.distinct(rows, "target_tokens")[0])


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
    ok = stats.ok(records)
    done = ok.where(~np.isnan(ok.numbers("restore_s")) & (np.nan_to_num(ok.numbers("restore_bytes")) != 0))
    if not done:
        return None
    rows = []
    for (n,), g in sorted(stats.groups(done, ("target_tokens",)).items(), key=lambda kv: kv[0][0] or 0):
        secs, size = g.numbers("restore_s"), g.numbers("restore_bytes")
        fast = secs > 0
        rows.append(
            {
                "length": n,
                "n": len(g),
                "tokens": int(np.median(np.nan_to_num(g.numbers("restore_tokens")))),
                "bytes": int(np.median(size)),
                "restore_s_p50": float(np.median(secs)),
                "gb_per_s_p50": float(np.median(size[fast] / secs[fast])) / 1e9 if fast.any() else None,
                "warm_ttft_s_p50": stats.percentile(stats.values(g, "request_ttft_s"), 50),
                "with_restore_s_p50": stats.percentile(stats.values(g, "ttft_s"), 50),
            }
        )
    sizes, tokens = done.numbers("restore_bytes"), np.nan_to_num(done.numbers("restore_tokens"))
    per_token = sizes[tokens != 0] / tokens[tokens != 0]
    out: dict[str, Any] = {
        "rows": rows,
        "kv_bytes_per_token": float(np.median(per_token)) if len(per_token) else None,
        "c_s": None,
        "gb_per_s": None,
    }
    if len(np.unique(sizes)) >= 2:
        (c, slope), *_ = np.linalg.lstsq(
            np.column_stack([np.ones_like(sizes), sizes]), done.numbers("restore_s"), rcond=None
        )
        out["c_s"], out["gb_per_s"] = float(c), (1.0 / float(slope) / 1e9 if slope > 0 else None)
    return out


def _reported(t: Table) -> tuple[Table, np.ndarray, np.ndarray]:
    """The records that report both their cached and prompt tokens, and those counts."""
    both = t.where(~np.isnan(t.numbers("cached_tokens")) & ~np.isnan(t.numbers("prompt_tokens")))
    return both, both.numbers("cached_tokens"), both.numbers("prompt_tokens")


def cache_verification(records: Records, cold_allowance: int = 0, block: int | None = None) -> dict[str, Any]:
    """Were warm requests served from cache, and were cold ones cold?"""
    done = stats.ok(records)
    warm, cold = (done.where(done.text_is("phase", p)) for p in ("warm", "cold"))
    reported, cached, prompt = _reported(warm)
    share = cached[prompt != 0] / prompt[prompt != 0]
    loop, loop_cached, loop_prompt = _reported(done.where(done.text_is("phase", "run")))
    loop_share = loop_cached[loop_prompt != 0] / loop_prompt[loop_prompt != 0]
    cold_cached = np.nan_to_num(cold.numbers("cached_tokens"), nan=-np.inf)
    return {
        "loop_requests": len(loop),
        "loop_mean_cached_share": float(np.mean(loop_share)) if len(loop_share) else None,
        "loop_hits": int((loop_share > 0).sum()),
        "warm_requests": len(warm),
        "warm_reported": len(reported),
        "warm_served_from_cache": sum(
            checks.warm_hit(int(c), int(n), block) for c, n in zip(cached, prompt, strict=True) if n
        ),
        "warm_mean_cached_share": float(np.mean(share)) if len(share) else None,
        "cold_requests": len(cold),
        "cold_not_cold": int((cold_cached > cold_allowance).sum()),
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
