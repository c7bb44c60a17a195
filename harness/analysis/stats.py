"""The one statistics core: every figure kvbench derives from request records is computed here,
for the terminal, run.json's summary, the report, the gate, `compare` and `baseline` alike, so
the same run gives the same number everywhere. Pure functions over `RequestRecord`s, worked on
the columns of a `results.Table` (a list of records is made one first).

Definitions:
- TTFT: request start (headers on the socket) -> first token-bearing chunk, plus the step kvbench
  took for the request before sending it, where there was one (`restore_s`: a prompt's KV brought
  back from disk, `warm_from = "disk"`): the whole cost of coming back from a tier, so that a
  disk arm compares like for like with a host arm, whose engine restores inside the request. The
  same holds for e2e, and a closed loop's span starts at its first restore. The request's own
  TTFT, without that step, is `request_ttft_s` (the record's `ttft_s` field).
- percentiles: linear interpolation between the two nearest ranks (numpy's default).
- ITL: every token gap of the requests that succeeded; where they number more than GAPS_HELD,
  those of every k-th request (gaps_every), which the report says beside the figure.
- req/s: completed requests / (last end - first start), as the Redbooks paper defines it.
- steady-state req/s: completions between the 10th and 90th percentile of end times, divided by
  that span: ramp-up and drain left out.
- speedup at a length: median cold TTFT / median warm TTFT; its 95 % interval is a percentile
  bootstrap resampling cold and warm requests independently.
- a group's TTFT median and mean intervals (interval): a percentile bootstrap up to
  LARGE_SAMPLE values; above it the median's distribution-free interval from order statistics
  (the ranks a binomial(n, 1/2) puts the 95 % bounds at) and the mean's Student's t interval,
  which the bootstrap's converge to there, in one pass instead of 2,000 resamples.
- steady-state req/s's 95 % interval (steady_rate_ci): batch means of the gaps between those
  completions (STEADY_BATCHES consecutive batches, Student's t over the batches' mean gaps),
  which allows for completions that come in waves, as a closed loop's do.
- drop: (before - after) / before.
- open loop: warm-up requests (phase "warmup") are left out of every figure but the counts of
  requests and failures. Schedule lag: real send time (start_s) - intended send time.
- TPOT: (e2e - TTFT) / (output tokens - 1), per request (vLLM's definition).
- the client's lateness (first_token_reads): how long after the kernel's stamp the client read
  the bytes that carried a first token, per request stamped by the kernel, in wall-clock ms.
- reuse captured (trace replay): the share of prompt tokens the server reported cached, over the
  share an infinite prefix cache could have served (harness/inputs/traces.py), both over the requests
  replayed.
- a request meets the SLO when it succeeded and its TTFT, TPOT and e2e are within every limit
  given (a one-token answer has no TPOT and is not judged on it); share met: requests meeting
  it / measured requests (failures count as missing it); goodput: requests meeting it per
  second over the measured requests' span (first start to last end), DistServe's definition.
- saturation: TTFT and the requests in flight at each send both rise through the run (Kendall's
  tau against the send time, one-sided p < SATURATION_P) and TTFT's last quarter's median is
  SATURATION_GROWTH x its first quarter's: the load outgrew the server instead of holding steady.

Statistical tests and intervals come from scipy.stats, imported where one is computed (so that
`kvbench run` starts without it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.results import RequestRecord, Table
from harness.results.record import TYPES

Records = Sequence[RequestRecord]
PER_REQUEST = ("ttft_s", "request_ttft_s", "first_byte_s", "first_content_s", "e2e_s", "itl_s", "tpot_s")
# Per-request metrics that include the step kvbench took before the request (`restore_s`)
WITH_RESTORE = ("ttft_s", "e2e_s")
QUANTILES = {"p50": 50.0, "p90": 90.0, "p99": 99.0}
CI_LEVEL = 0.95
CI_RESAMPLES = 2000
# The most values one batch of bootstrap resamples holds (8 bytes each): scipy resamples
# `batch` at a time, so the interval of a million records costs 32 MB instead of 2,000 copies
# of them (16 GB; the report of a 10^6-record run was killed at 24 GB).
CI_BATCH_VALUES = 4_000_000
# Up to this many groups, `groups` finds each group's records by a pass over the codes
FEW_GROUPS = 64
# Integers in a range up to this (a field's values, a group's code) are counted, a count per
# value, instead of sorted: a pass over 10^7 of them, not a sort
COUNTED_MAX = 4_000_000
# The most token gaps an ITL figure is computed from (8 bytes each): a day-long run's billions
# are sampled, every k-th request's gaps (gaps_every), and the figure says so
GAPS_HELD = 4_000_000
STEADY_QUANTILES = (0.1, 0.9)
STEADY_BATCHES = 8  # batches of the steady-state interval (fewer where fewer gaps: at least 2)
STEADY_MIN_GAPS_PER_BATCH = 3
SATURATION_P = 0.01
SATURATION_GROWTH = 1.5
SATURATION_MIN_REQUESTS = 12  # fewer cannot show a trend
# The embedded emulator's first tokens may be late against its own model by this share of their
# modelled TTFT (median, over the requests of one figure) before that figure is marked as not the
# model's: its CPU work no longer fits in the modelled times at this time scale (the concurrency
# scenario at time scale 20: 5 % late, and req/s 3 % low). Loop wake-up jitter stays below it.
EMULATOR_LATE_SHARE = 0.02


def ok(records: Iterable[RequestRecord]) -> Table:
    t = Table.of(records)
    return t.where(t.ok)


def erred(records: Iterable[RequestRecord]) -> Table:
    """The records with an error text."""
    t = Table.of(records)
    return t.where(t.flag("erred"))


def values(records: Iterable[RequestRecord], metric: str) -> np.ndarray:
    """The values of a per-request metric over the requests that succeeded (every gap for itl_s);
    TTFT and e2e with the restore before the request added (WITH_RESTORE)."""
    done = ok(records)
    if metric == "itl_s":
        return gaps(done)
    if metric == "tpot_s":
        x = tpots(done)
    elif metric in WITH_RESTORE and done.has("restore_s"):
        x = done.numbers(metric) + np.nan_to_num(done.numbers("restore_s"))
    elif metric in WITH_RESTORE:
        x = done.numbers(metric)
    else:
        x = done.numbers("ttft_s" if metric == "request_ttft_s" else metric)
    given = ~np.isnan(x)
    return x if given.all() else x[given]  # (a table's own column, read-only, where all are given)


def gaps(records: Iterable[RequestRecord], every: int | None = None, held: int = GAPS_HELD) -> np.ndarray:
    """Every token gap of these records, in their order (none where they were read without);
    beyond `held` gaps, those of every `gaps_every`-th record (or of every `every`-th: a bound
    over several calls, as the gate's over a run's groups)."""
    t = Table.of(records)
    every = gaps_every(t, held) if every is None else every
    if every > 1:
        t = t[::every]
    n = int(t.gap_counts.sum())
    if not n:
        return np.zeros(0, np.float64)
    return np.fromiter((g for d in t.parsed() for g in d.get("itl_s") or ()), np.float64, n)


def gaps_every(records: Iterable[RequestRecord], held: int = GAPS_HELD) -> int:
    """1 where the records' token gaps number at most `held`; else k, the ITL figures' sample
    being every k-th record's gaps (in the records' order)."""
    t = Table.of(records)
    return max(1, -(-int(t.gap_counts.sum()) // held))


def tpots(t: Table) -> np.ndarray:
    """Each record's TPOT (RequestRecord.tpot_s), NaN where it has none."""
    n = t.numbers("completion_tokens")
    with np.errstate(invalid="ignore", divide="ignore"):
        x = (t.numbers("e2e_s") - t.numbers("ttft_s")) / (n - 1)
    return np.where(n >= 2, x, np.nan)


def context_tokens(t: Table) -> np.ndarray:
    """Each prompt's length (RequestRecord.context_tokens): the server's count, else the target."""
    prompt = t.numbers("prompt_tokens")
    return np.where(np.isnan(prompt), t.numbers("target_tokens"), prompt)


def begins(t: Table) -> np.ndarray:
    """When each request's cost began: its start, or the start of the restore kvbench did for it."""
    start = t.numbers("start_s")
    return start - np.nan_to_num(t.numbers("restore_s")) if t.has("restore_s") else start


def restored(records: Iterable[RequestRecord]) -> bool:
    """Did kvbench bring any request's KV back itself before sending it (`restore_s`)? Then TTFT
    and e2e include that step, and the terminal and report say so (RESTORE_NOTE)."""
    return bool((~np.isnan(Table.of(records).numbers("restore_s"))).any())


RESTORE_NOTE = (
    "warm TTFT includes the restore kvbench performed before each warm request (restore_s): the whole "
    "cost of coming back from disk, as a host tier's restore is inside its requests; request_ttft_s "
    "is the request alone"
)


def percentile(x: np.ndarray | Iterable[float], p: float) -> float | None:
    a = np.fromiter(x, dtype=np.float64) if not isinstance(x, np.ndarray) else x
    return float(np.percentile(a, p)) if len(a) else None


def describe(x: np.ndarray | Sequence[float]) -> dict[str, Any]:
    """count, mean, p50, p90, p99, min, max (None for no values)."""
    a = np.asarray(x, dtype=np.float64)
    if not len(a):
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    q = np.percentile(a, list(QUANTILES.values()))
    return {
        "count": len(a),
        "mean": float(a.mean()),
        **{k: float(v) for k, v in zip(QUANTILES, q, strict=True)},
        "min": float(a.min()),
        "max": float(a.max()),
    }


def aggregate(x: np.ndarray, agg: str) -> float:
    """One named aggregate: count, mean, min, max or pNN."""
    if agg == "count":
        return float(len(x))
    if len(x) == 0:
        return float("nan")
    if agg == "mean":
        return float(np.mean(x))
    if agg == "min":
        return float(np.min(x))
    if agg == "max":
        return float(np.max(x))
    return float(np.percentile(x, float(agg[1:])))


@dataclass(frozen=True)
class Throughput:
    completed: int
    failed: int
    req_per_s: float | None
    steady_req_per_s: float | None
    output_tokens_per_s: float | None
    duration_s: float | None
    mean_concurrency: float | None


def throughput(records: Records) -> Throughput:
    t = Table.of(records)
    done = t.where(t.ok)
    failed = len(t) - len(done)
    if not done:
        return Throughput(0, failed, None, None, None, None, None)
    begin = begins(t)
    first = float(begin.min())
    ends = _ends(done)
    span = float(ends[-1]) - first
    steady, lo, hi = _steady(ends)
    inside = len(steady)
    tokens = total(done, "completion_tokens")
    # requests in flight, integrated over the run: each request from its begin to its end, or
    # to the last event where it has no end (worked in place: a run's 10^7 values at a time)
    end = t.numbers("start_s") + t.numbers("e2e_s")
    unended = np.isnan(end)
    last = max(float(begin.max()), float(np.nanmax(end, initial=-np.inf)))
    np.copyto(end, last, where=unended)
    end -= begin
    area = float(end.sum())
    positive = span > 0
    return Throughput(
        completed=len(done),
        failed=failed,
        req_per_s=len(done) / span if positive else None,
        steady_req_per_s=inside / (hi - lo) if hi > lo else None,
        output_tokens_per_s=tokens / span if positive else None,
        duration_s=span if positive else None,
        mean_concurrency=area / span if positive else None,
    )


def _ends(done: Records) -> np.ndarray:
    """When each of these (successful) requests ended, in order."""
    t = Table.of(done)
    ends = np.nan_to_num(t.numbers("e2e_s"))
    ends += t.numbers("start_s")
    ends.sort()
    return ends


def total(t: Table, name: str) -> float:
    """The sum of a number field over the records that have it."""
    if (held := t.integers(name)) is not None:
        return float(held[0].sum(dtype=np.int64))  # an absent value is held as 0
    return float(np.nansum(t.numbers(name)))


def _steady(ends: np.ndarray) -> tuple[np.ndarray, float, float]:
    """The completions (sorted end times) of the steady state, and its window's bounds."""
    lo, hi = np.quantile(ends, STEADY_QUANTILES)
    return ends[(ends > lo) & (ends <= hi)], float(lo), float(hi)


def steady_rate_ci(records: Records) -> tuple[float, float] | None:
    """The CI_LEVEL interval of throughput(records).steady_req_per_s (see the module's
    definition); None when its window holds too few completions for two batches, or they are
    too irregular for an upper bound."""
    from scipy.stats import t as student

    ends = _ends(ok(records))
    if len(ends) < 2:
        return None
    inside, lo, hi = _steady(ends)
    gaps = np.diff(inside)
    batches = min(STEADY_BATCHES, len(gaps) // STEADY_MIN_GAPS_PER_BATCH)
    if batches < 2 or hi <= lo:
        return None
    means = np.asarray([b.mean() for b in np.array_split(gaps, batches)])
    mean, half = float(means.mean()), float(student.ppf((1 + CI_LEVEL) / 2, batches - 1) * means.std(ddof=1))
    half /= float(np.sqrt(batches))
    rate = len(inside) / (hi - lo)
    if mean <= half:
        return None  # so irregular that no upper bound can be given
    # the interval of the mean gap, as rates around the steady figure
    return rate * mean / (mean + half), rate * mean / (mean - half)


def lengths(records: Records) -> list[int]:
    return [n for n in distinct(Table.of(records), "target_tokens")[0] if n is not None]


def emulator_late_share(records: Iterable[RequestRecord]) -> float | None:
    """The median share of their modelled TTFT by which the embedded emulator sent these requests'
    first tokens late (beyond its timer's granularity); None where no record says (another server)."""
    done = ok(records)
    late, ttft = done.numbers("emulator_late_s"), done.numbers("ttft_s")
    modelled = ttft - late
    with np.errstate(invalid="ignore"):
        told = modelled > 0  # False where either is absent (NaN)
    return percentile(late[told] / modelled[told], 50)


def sweep_rows(records: Records, intervals: bool = False) -> list[dict[str, Any]]:
    """Per prompt length: cold and warm TTFT medians, the speedup, and (on request) its interval;
    where the embedded emulator answered, how late it ran in each phase, and whether that makes
    the row not the model's (`emulator_late`)."""
    t = Table.of(records)
    target = t.numbers("target_tokens")
    rows = []
    for n in lengths(t):
        at = t.where(target == n)
        phase = {p: at.where(at.text_is("phase", p)) for p in ("cold", "warm")}
        cold, warm = values(phase["cold"], "ttft_s"), values(phase["warm"], "ttft_s")
        c50, w50 = percentile(cold, 50), percentile(warm, 50)
        row: dict[str, Any] = {
            "length": n,
            "cold_n": len(cold),
            "warm_n": len(warm),
            "cold_ttft_p50_s": c50,
            "warm_ttft_p50_s": w50,
            "speedup": c50 / w50 if c50 is not None and w50 else None,
        }
        if restored(at):  # the warm figure above has the restore in it; the request alone:
            row["warm_request_ttft_p50_s"] = percentile(values(phase["warm"], "request_ttft_s"), 50)
        late = {p: emulator_late_share(phase[p]) for p in ("cold", "warm")}
        if any(v is not None for v in late.values()):
            row["cold_emulator_late_share"], row["warm_emulator_late_share"] = late["cold"], late["warm"]
            row["emulator_late"] = any(v is not None and v > EMULATOR_LATE_SHARE for v in late.values())
        if intervals:
            ci = bootstrap_ci((cold, warm), _median_ratio)
            row["speedup_ci_lo"], row["speedup_ci_hi"] = ci if ci else (None, None)
        rows.append(row)
    return rows


def summary(records: Records) -> dict[str, Any]:
    """What run.json's summary of any arm (or load of an arm) starts with: the counts, and TTFT
    and e2e over the measured requests that succeeded. A workload kind adds its own figures
    (analysis/kinds `Figures.summary`)."""
    t = Table.of(records)
    completed = int(t.ok.sum())
    out: dict[str, Any] = {
        "requests": len(t),
        "completed": completed,
        "failed": len(t) - completed,
    }
    kept = ok(measured(t))
    out["ttft_s"] = describe(values(kept, "ttft_s"))
    out["e2e_s"] = describe(values(kept, "e2e_s"))
    if restored(t):
        out["ttft_includes_restore"] = True
        out["request_ttft_s"] = describe(values(kept, "request_ttft_s"))
    return out


def rates(counted: Records) -> dict[str, Any]:
    """An arm's throughput figures for its summary, over the measured requests."""
    t = throughput(counted)
    return {"req_per_s": t.req_per_s, "output_tokens_per_s": t.output_tokens_per_s, "duration_s": t.duration_s}


def cached_share(records: Records) -> float | None:
    """Prompt tokens the server reported cached / prompt tokens, over the requests that
    succeeded and report both (None when none does)."""
    done = ok(records)
    cached, prompt = done.numbers("cached_tokens"), done.numbers("prompt_tokens")
    both = ~np.isnan(cached) & (np.nan_to_num(prompt) != 0)
    total = float(prompt[both].sum())
    return float(cached[both].sum()) / total if total else None


def measured(records: Iterable[RequestRecord]) -> Table:
    """The records that count: all but an open loop's warm-up."""
    t = Table.of(records)
    return t.where(~t.text_is("phase", "warmup"))


def schedule_lag(records: Records) -> dict[str, Any]:
    """How late requests were sent against their schedule (model seconds), how many were held
    back (by max_concurrency, or a session by max_active), and the rate intended against the rate
    really sent."""
    t = Table.of(records)
    intended = t.numbers("intended_s")
    timed = ~np.isnan(intended)
    intended, start = np.sort(intended[timed]), t.numbers("start_s")[timed]
    lag = start - t.numbers("intended_s")[timed]
    held = np.nan_to_num(t.numbers("held_s")[timed])
    held = held[held != 0]
    out: dict[str, Any] = {
        "requests": len(lag),
        "p50_s": percentile(lag, 50),
        "p99_s": percentile(lag, 99),
        "max_s": float(lag.max()) if len(lag) else None,
        "held_back": len(held),
        "held_p99_s": percentile(held, 99),
        "intended_req_per_s": None,
        "sent_req_per_s": None,
    }
    if len(lag) >= 2:
        intended_span = float(intended[-1] - intended[0])
        first, last = float(start.min()), float(start.max())
        if intended_span > 0:
            out["intended_req_per_s"] = (len(lag) - 1) / intended_span
        if last > first:
            out["sent_req_per_s"] = (len(lag) - 1) / (last - first)
    return out


def first_token_reads(records: Records, time_scale: float = 1.0) -> dict[str, Any]:
    """Where the first tokens' stamps came from (kernel or user space), how late the client read
    the kernel-stamped ones (wall-clock ms: p50, p99, max), and how many of those came in one
    read with later data of their response (their stamp is the later data's: wire/stamps.py)."""
    t = Table.of(records)
    firsts = ~np.isnan(t.numbers("ttft_s"))
    late = t.numbers("first_token_late_s")
    kernel = firsts & t.text_is("first_token_stamp", "kernel") & ~np.isnan(late)
    late_ms = late[kernel] * 1e3 / time_scale
    return {
        "kernel": int(kernel.sum()),
        "user": int(firsts.sum() - kernel.sum()),
        "late_ms": {
            "p50": percentile(late_ms, 50),
            "p99": percentile(late_ms, 99),
            "max": float(late_ms.max()) if len(late_ms) else None,
        },
        "shared_reads": int((np.nan_to_num(t.numbers("first_token_shared")[kernel]) != 0).sum()),
    }


def schedule_lag_of(records: Records, process: int) -> dict[str, Any] | None:
    """schedule_lag of what one client process or Ray worker sent at a time of a timed arm's
    measured part (None when it sent none at a time)."""
    kept = measured(records)
    mine = kept.where((kept.numbers("process") == process) & ~np.isnan(kept.numbers("intended_s")))
    return schedule_lag(mine) if mine else None


def meeting(records: Records, slo: dict[str, float]) -> np.ndarray:
    """Whether each request met every limit of the SLO (see the module's definition)."""
    t = Table.of(records)
    met = t.ok.copy()
    for metric, limit in slo.items():
        v = tpots(t) if metric == "tpot_s" else t.numbers(metric)
        if metric == "tpot_s":
            v = np.where(np.isnan(v), -np.inf, v)  # one output token: nothing after the first to be slow
        with np.errstate(invalid="ignore"):
            met &= v <= limit  # NaN (no value) fails
    return met


def goodput(records: Records, slo: dict[str, float]) -> dict[str, Any]:
    """The requests meeting every SLO limit: how many, their share, and per second."""
    kept = measured(records)
    met = int(meeting(kept, slo).sum())
    span = throughput(kept).duration_s
    return {
        "limits": dict(slo),
        "requests": len(kept),
        "met": met,
        "share_met": met / len(kept) if kept else None,
        "goodput_req_per_s": met / span if span else None,
    }


def in_flight_at_send(records: Records) -> tuple[np.ndarray, np.ndarray]:
    """Send times in order, and the requests in flight just before each was sent."""
    t = Table.of(records)
    end = t.numbers("start_s") + t.numbers("e2e_s")
    ends = np.sort(end[~np.isnan(end)])
    starts = np.sort(t.numbers("start_s"))
    return starts, np.arange(len(starts)) - np.searchsorted(ends, starts, side="right")


def saturation(records: Records) -> dict[str, Any]:
    """Did the load outgrow the server (see the module's definition)? `saturated` is None when
    there are too few requests to tell."""
    counted = measured(records)
    kept = counted.take(np.argsort(counted.numbers("start_s"), kind="stable"))
    done = kept.where(kept.ok & ~np.isnan(kept.numbers("ttft_s")))
    out: dict[str, Any] = {"saturated": None, "ttft_trend_p": None, "in_flight_trend_p": None, "ttft_growth": None}
    if len(done) < SATURATION_MIN_REQUESTS:
        return out
    from scipy.stats import kendalltau

    ttft, t = done.numbers("ttft_s"), done.numbers("start_s")
    level = in_flight_at_send(kept)[1].astype(np.float64)
    q = max(1, len(ttft) // 4)
    first = float(np.median(ttft[:q]))
    growth = float(np.median(ttft[-q:])) / first if first > 0 else None
    p_ttft = _trend_p(kendalltau, t, ttft)
    p_level = _trend_p(kendalltau, np.arange(len(level), dtype=np.float64), level)
    out.update(ttft_trend_p=p_ttft, in_flight_trend_p=p_level, ttft_growth=growth)
    out["saturated"] = bool(
        p_ttft < SATURATION_P and p_level < SATURATION_P and growth is not None and growth >= SATURATION_GROWTH
    )
    return out


def _trend_p(kendalltau: Callable[..., Any], x: np.ndarray, y: np.ndarray) -> float:
    if np.ptp(y) == 0:
        return 1.0  # flat: no trend (and no tau to compute)
    p = float(kendalltau(x, y, alternative="greater").pvalue)
    return p if np.isfinite(p) else 1.0


def share_ci(met: int, n: int) -> tuple[float, float]:
    """The CI_LEVEL Wilson interval of a share of n requests of which `met` met a target."""
    from scipy.stats import binomtest

    ci = binomtest(met, n).proportion_ci(CI_LEVEL, method="wilson")
    return float(ci.low), float(ci.high)


def arrival_fit(records: Records, arrivals: str, rate: float, shape: float) -> dict[str, Any]:
    """How the real send times match the arrival process asked for: the coefficient of
    variation of their gaps against the process's, and (poisson, gamma) the p-value of a
    Kolmogorov-Smirnov test of the gaps against the process's gap distribution at `rate`."""
    t = Table.of(records)
    starts = np.sort(t.numbers("start_s")[~np.isnan(t.numbers("intended_s"))])
    g = np.diff(starts)
    expected = {"constant": 0.0, "poisson": 1.0}.get(arrivals, 1.0 / float(np.sqrt(shape)))
    out: dict[str, Any] = {"gaps": len(g), "cv": None, "expected_cv": expected, "ks_p": None}
    if len(g) < 2 or g.mean() <= 0:
        return out
    out["cv"] = float(g.std(ddof=1) / g.mean())
    if arrivals != "constant":
        from scipy.stats import kstest

        k = 1.0 if arrivals == "poisson" else shape
        out["ks_p"] = float(kstest(g, "gamma", args=(k, 0.0, 1.0 / (k * rate))).pvalue)
    return out


def groups(
    records: Records,
    by: Sequence[str],
    mapped: dict[str, Callable[[Any], Any]] | None = None,
    *,
    counted: int = COUNTED_MAX,
    few: int = FEW_GROUPS,
) -> dict[tuple[Any, ...], Table]:
    """Records grouped by the values of some of their fields (each group in the records' order),
    in sorted key order; a field in `mapped` by what its function makes of its value (a prompt
    length's bin). `counted` and `few` choose how (COUNTED_MAX, FEW_GROUPS), not what."""
    t = Table.of(records)
    keys, fields = [], []
    for name in by:
        labels, code = distinct(t, name, counted)
        if mapped and name in mapped:
            labels, code = _mapped(labels, code, mapped[name])
        keys.append(labels)
        fields.append(code)
    combos = math.prod(len(labels) for labels in keys)
    codes: np.ndarray = np.zeros(len(t), np.int32 if combos < 2**31 else np.int64)  # 40 MB for 10^7 records
    for labels, code in zip(keys, fields, strict=True):
        np.multiply(codes, len(labels), out=codes)
        np.add(codes, code, out=codes, casting="unsafe")  # within the combinations: no overflow
    del fields
    found = np.flatnonzero(np.bincount(codes)) if len(codes) and codes.max() < counted else np.unique(codes)
    if len(found) == 1:  # one group: all of the records, no row numbers
        rows: list[np.ndarray] | None = None
    elif len(found) <= few:  # a pass over the codes per group: no sort of 10^7 of them
        rows = [np.flatnonzero(codes == g) for g in found.tolist()]
    else:
        order = np.argsort(codes, kind="stable")
        rows = np.split(order, np.searchsorted(codes[order], found[1:]))
    out = {}
    for k, g in enumerate(found.tolist()):
        key = []
        for labels in reversed(keys):
            g, i = divmod(g, len(labels))
            key.append(labels[i])
        out[tuple(reversed(key))] = t if rows is None else t.take(rows[k])
    return dict(sorted(out.items(), key=lambda kv: tuple((v is None, v) for v in kv[0])))


def distinct(t: Table, name: str, counted: int = COUNTED_MAX) -> tuple[list[Any], np.ndarray]:
    """A field's distinct values (None among them where a record has none), and a code per
    record into them."""
    if str in TYPES.get(name, ()):
        code, labels = t.codes(name)
        seen = np.bincount(code, minlength=len(labels)) > 0 if len(code) else np.zeros(len(labels), bool)
        renumbered = (np.cumsum(seen) - 1).astype(np.int32)
        return [labels[c] for c in np.flatnonzero(seen).tolist()], renumbered[code]
    held = t.integers(name)
    if held is not None and len(held[0]) and (by_count := _distinct_integers(*held, counted)) is not None:
        return by_count
    x = t.numbers(name)
    missing = np.isnan(x)
    values, code = np.unique(x[~missing], return_inverse=True)
    as_int = float not in TYPES.get(name, (float,))
    found: list[Any] = [int(v) if as_int else float(v) for v in values]
    out = np.full(len(t), len(found), np.int64)
    out[~missing] = code
    return found + [None] * bool(missing.any()), out


def _distinct_integers(
    values: np.ndarray, missing: np.ndarray | None, counted: int
) -> tuple[list[Any], np.ndarray] | None:
    """distinct of integers (a prompt length, a worker) counted by value, not sorted; None where
    their range is too wide for a count per value."""
    given = values if missing is None else values[~missing]
    lo, hi = (int(given.min()), int(given.max())) if len(given) else (0, 0)
    if hi - lo >= counted:
        return None
    shifted = values.astype(np.int32 if values.itemsize <= 4 else np.int64)  # the values fit: so does this
    np.subtract(shifted, lo, out=shifted)
    if missing is not None:
        shifted[missing] = 0
    seen = np.bincount(shifted if missing is None else shifted[~missing], minlength=hi - lo + 1) > 0
    labels: list[Any] = [lo + int(v) for v in np.flatnonzero(seen)]
    out = (np.cumsum(seen) - 1).astype(np.int32)[shifted]
    if missing is not None:
        out[missing] = len(labels)
    return labels + [None] * bool(missing is not None and missing.any()), out


def _mapped(labels: list[Any], code: np.ndarray, f: Callable[[Any], Any]) -> tuple[list[Any], np.ndarray]:
    """Codes into `labels` as codes into what f makes of them (several may make the same)."""
    made = [f(v) for v in labels]
    index: dict[Any, int] = {}
    to = np.asarray([index.setdefault(m, len(index)) for m in made], dtype=np.int64)
    return list(index), to[code] if len(to) else code


def drop(before: float, after: float) -> dict[str, float]:
    """Ratio and percentage drop from `before` to `after` (e.g. req/s clean vs with traffic)."""
    return {"ratio": after / before, "drop_pct": (before - after) / before * 100.0}


def mann_whitney_p(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float | None:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie- and
    continuity-corrected); None when either sample has fewer than 2 values."""
    if len(x) < 2 or len(y) < 2:
        return None
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if np.ptp(np.concatenate((a, b))) == 0:
        return 1.0  # all values equal: no difference to test (scipy would divide by zero)
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=True).pvalue)


def _median_ratio(cold: np.ndarray, warm: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.median(cold, axis=axis) / np.median(warm, axis=axis))


def _median(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.median(x, axis=axis))


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(np.mean(x, axis=axis))


STATISTICS: dict[str, Callable[..., np.ndarray]] = {"p50": _median, "mean": _mean}
# Above this many values a group's median and mean intervals are computed, not resampled
# (`interval`): at 2x10^5 TTFTs the bootstrap took 18 of a report's 39 s
LARGE_SAMPLE = 20_000


def interval(x: np.ndarray, name: str) -> tuple[float, float] | None:
    """The CI_LEVEL interval of STATISTICS[name] ("p50" or "mean") of one sample (see the
    module's definitions): bootstrapped up to LARGE_SAMPLE values, computed above."""
    if len(x) <= LARGE_SAMPLE:
        return bootstrap_ci((x,), STATISTICS[name])
    from scipy.stats import binom, t

    n = len(x)
    if name == "mean":
        half = float(t.ppf((1 + CI_LEVEL) / 2, n - 1) * np.std(x, ddof=1) / np.sqrt(n))
        m = float(np.mean(x))
        return m - half, m + half
    # the median: [X(r), X(n - r + 1)] (ranks from 1), r the binomial(n, 1/2)'s (1 - level)/2
    # quantile, covers it with probability at least CI_LEVEL
    r = int(binom.ppf((1 - CI_LEVEL) / 2, n, 0.5))
    lo, hi = max(0, r - 1), min(n - 1, n - r)
    part = np.partition(x, (lo, hi))
    return float(part[lo]), float(part[hi])


def bootstrap_ci(
    samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], seed: int = 0
) -> tuple[float, float] | None:
    """Percentile bootstrap interval (CI_LEVEL) of `statistic` over independent samples; None
    when a sample has fewer than 2 values or every resample gives the same value."""
    if any(len(s) < 2 for s in samples):
        return None
    if all(len(np.unique(s)) == 1 for s in samples):
        v = float(statistic(*samples))
        return v, v
    from scipy.stats import bootstrap

    res = bootstrap(
        samples,
        statistic,
        n_resamples=CI_RESAMPLES,
        confidence_level=CI_LEVEL,
        method="percentile",
        vectorized=True,
        batch=max(1, CI_BATCH_VALUES // max(len(s) for s in samples)),
        paired=False,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
