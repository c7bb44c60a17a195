"""An open loop's loads, read together: per arm the curve of latency and goodput against offered
load, where it saturated, and its capacity at the SLO; across arms what a KV tier buys, as
capacity. Pure: computed from result folders' raw records (via the statistics core), for the
terminal and capacity.json (runner), the report and the gate alike.

- A point is one load: a rate of arrivals, or the "serial" probe (one request at a time, placed
  at the rate it achieved). The "saturated" probe (a closed loop) gives the arm's maximum
  throughput, with its 95 % interval (stats.steady_rate_ci), and is not a point of the curve.
- Capacity at the SLO: between the highest rate whose share of requests meeting the SLO holds
  and the next one up, where the share, interpolated linearly, crosses the required share. Its
  interval takes the share at those two rates anywhere within their 95 % Wilson intervals
  (binomial: n requests, k met), and stays within the two rates: a sweep cannot say more than its
  rates resolve. When every rate holds the SLO the capacity is at least the highest; when none
  does, below the lowest.
- Never above what the server sustains. With the saturated probe, that is its throughput: a
  capacity above it is capped there (bound "saturation"), its interval the probe's. A rate's own
  verdict of saturation (TTFT and requests in flight rising through its run) then does not
  decide the capacity: near the maximum throughput a queue that starts empty rises through a run
  of tens of requests without the server falling behind for good, so that verdict came out on
  either side from run to run (kv-tier-capacity.toml: 6.2 and 6.3 req/s in two runs, 7.2 in two
  others). Without the probe (rates listed), the first rate found saturated is where the capacity
  stops: what it completed, within the rates around it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from harness.analysis import stats
from harness.config.scenario import Slo
from harness.results import RunResult, Table

# rates = "auto" goes this far beyond the saturated throughput, so that a rate fails
AUTO_BEYOND = 1.2


@dataclass(frozen=True)
class Point:
    mode: str  # "rate" | "serial"
    offered_req_per_s: float
    achieved_req_per_s: float | None
    requests: int
    met: int | None
    share_met: float | None
    share_lo: float | None
    share_hi: float | None
    goodput_req_per_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    lag_p99_s: float | None
    held_back: int
    saturated: bool | None
    # the arrivals really sent against the process asked for (stats.arrival_fit); None for a
    # serial probe
    arrivals: str | None = None
    gaps_cv: float | None = None
    expected_cv: float | None = None
    ks_p: float | None = None


@dataclass(frozen=True)
class Capacity:
    req_per_s: float | None  # None: below the lowest rate
    low: float | None
    high: float | None
    # "measured" | "at_least" (every rate held) | "below" (no rate held) | "saturation" (held
    # up to the arm's saturated throughput, and capped there) | "no_slo"
    bound: str
    required_share: float | None


def slo_of(run: RunResult) -> tuple[dict[str, float], float] | None:
    """The SLO limits and required share a run was measured against (its scenario's [slo])."""
    slo = run.scenario.get("slo")
    if not isinstance(slo, dict):
        return None
    limits = {k: float(v) for k in ("ttft_s", "tpot_s", "e2e_s") if isinstance(v := slo.get(k), int | float) and v}
    return (limits, float(slo.get("share", Slo.share))) if limits else None


def point(run: RunResult) -> Point | None:
    """One load of an open-loop arm (None for the saturated probe or an empty folder)."""
    load = run.load
    kept = stats.measured(run.records)
    if load.get("mode") == "saturated" or not kept:
        return None
    t = stats.throughput(kept)
    offered = run.rate if load.get("mode", "rate") == "rate" else t.req_per_s
    if offered is None:
        return None
    slo = slo_of(run)
    g = stats.goodput(kept, slo[0]) if slo else None
    lo_hi = stats.share_ci(g["met"], g["requests"]) if g and g["requests"] else (None, None)
    lag = stats.schedule_lag(kept)
    ttft, tpot = stats.values(kept, "ttft_s"), stats.values(kept, "tpot_s")
    w = run.scenario.get("workload") or {}
    arrivals = str(w.get("arrivals") or "poisson") if load.get("mode", "rate") == "rate" else None
    fit = stats.arrival_fit(kept, arrivals, float(offered), float(w.get("gamma_shape") or 1.0)) if arrivals else {}
    return Point(
        mode=str(load.get("mode", "rate")),
        offered_req_per_s=float(offered),
        achieved_req_per_s=t.req_per_s,
        requests=len(kept),
        met=g["met"] if g else None,
        share_met=g["share_met"] if g else None,
        share_lo=lo_hi[0],
        share_hi=lo_hi[1],
        goodput_req_per_s=g["goodput_req_per_s"] if g else None,
        ttft_p50_s=stats.percentile(ttft, 50),
        ttft_p99_s=stats.percentile(ttft, 99),
        tpot_p50_s=stats.percentile(tpot, 50),
        tpot_p99_s=stats.percentile(tpot, 99),
        lag_p99_s=lag["p99_s"],
        held_back=lag["held_back"],
        saturated=stats.saturation(kept)["saturated"],
        arrivals=arrivals,
        gaps_cv=fit.get("cv"),
        expected_cv=fit.get("expected_cv"),
        ks_p=fit.get("ks_p"),
    )


def _cross(r_a: float, s_a: float, r_b: float, s_b: float, target: float) -> float:
    """Where the line from (r_a, s_a) to (r_b, s_b) crosses `target`, kept within [r_a, r_b]."""
    if s_a <= target:
        return r_a
    if s_b >= target:
        return r_b
    return r_a + (s_a - target) / (s_a - s_b) * (r_b - r_a)


@dataclass(frozen=True)
class Ceiling:
    """What the arm sustains: its saturated probe's steady-state throughput and 95 % interval
    (None where the probe had too few completions for one), over how many requests."""

    req_per_s: float
    low: float | None
    high: float | None
    requests: int


def holds(p: Point, share: float, by_saturation: bool = True) -> bool:
    return (p.share_met or 0.0) >= share and not (by_saturation and p.saturated)


def capacity(points: Sequence[Point], share: float | None, ceiling: Ceiling | None = None) -> Capacity:
    """The capacity at the SLO of one arm's points (see the module's definition), never above
    `ceiling`, the arm's saturated throughput (its closed-loop probe): a rate above what the
    server completes that still met the SLO did so only because too few requests were sent for
    its queue to show (bound "saturation", with the probe's interval)."""
    if ceiling is None:
        return _capacity(points, share, by_saturation=True)
    c = _capacity(points, share, by_saturation=False)
    if c.req_per_s is None or c.req_per_s <= ceiling.req_per_s:
        if c.bound == "measured" and c.high is not None and ceiling.high is not None:
            return Capacity(c.req_per_s, c.low, min(c.high, ceiling.high), c.bound, share)
        return c
    low, high = ceiling.low, ceiling.high
    if high is not None and c.bound == "measured" and c.high is not None:
        high = max(min(high, c.high), ceiling.req_per_s)
    return Capacity(ceiling.req_per_s, low, high, "saturation", share)


def _capacity(points: Sequence[Point], share: float | None, by_saturation: bool) -> Capacity:
    pts = sorted((p for p in points if p.share_met is not None), key=lambda p: p.offered_req_per_s)
    if share is None or not pts:
        return Capacity(None, None, None, "no_slo", share)
    fail = _first_failing(pts, share, by_saturation)
    if fail is None:
        top = pts[-1].offered_req_per_s
        return Capacity(top, top, None, "at_least", share)
    if fail == 0:
        return Capacity(None, None, pts[0].offered_req_per_s, "below", share)
    a, b = pts[fail - 1], pts[fail]
    ra, rb = a.offered_req_per_s, b.offered_req_per_s
    sa, sb = a.share_met or 0.0, b.share_met or 0.0
    if sb >= share:  # b failed by saturation alone: what it completed is what the server sustains
        top = b.achieved_req_per_s if b.achieved_req_per_s is not None else rb
        return Capacity(min(max(top, ra), rb), ra, rb, "measured", share)
    value = _cross(ra, sa, rb, sb, share)
    low = _cross(ra, max(a.share_lo or sa, share), rb, b.share_lo or sb, share)
    high = _cross(ra, a.share_hi or sa, rb, b.share_hi or sb, share)
    return Capacity(value, min(low, value), max(high, value), "measured", share)


def saturation_rate(points: Sequence[Point]) -> float | None:
    """The lowest offered rate found saturated."""
    hits = [p.offered_req_per_s for p in points if p.mode == "rate" and p.saturated]
    return min(hits) if hits else None


def auto_rates(serial_req_per_s: float, saturated_req_per_s: float, n: int) -> list[float]:
    """The rates of `rates = "auto"`: n spread evenly above the one-at-a-time rate up to the
    saturated throughput (as GuideLLM's sweep spreads them), and one AUTO_BEYOND it."""
    lo, hi = serial_req_per_s, max(saturated_req_per_s, serial_req_per_s)
    if hi <= lo * 1.001:
        return [hi, hi * AUTO_BEYOND]
    return [float(x) for x in np.linspace(lo, hi, n + 1)[1:]] + [hi * AUTO_BEYOND]


def stop_reason(summary: dict[str, Any], required_share: float | None) -> str | None:
    """Why a sweep stops going up after this load (None: go on)."""
    sat = (summary.get("saturation") or {}).get("saturated")
    share = (summary.get("slo") or {}).get("share_met")
    if required_share is not None and share is not None and share < required_share:
        return f"the SLO failed ({share:.0%} of requests met it, {required_share:.0%} required)"
    if sat:
        return "saturated (TTFT and requests in flight grew through the run)"
    return None


@dataclass(frozen=True)
class ArmCurve:
    arm: str
    cache: str  # the arm's `cache`: "bust" (no tier) or "reuse"
    points: tuple[Point, ...]
    saturated: Ceiling | None  # the closed-loop probe's throughput
    saturation_rate: float | None
    capacity: Capacity

    @property
    def saturated_req_per_s(self) -> float | None:
        return self.saturated.req_per_s if self.saturated else None


def curves(runs: Sequence[RunResult]) -> list[ArmCurve]:
    """Per arm measured at loads (an open loop's), in the order the runs came."""
    by_arm: dict[str, list[RunResult]] = {}
    for r in runs:
        if r.load:
            by_arm.setdefault(r.arm, []).append(r)
    out = []
    for arm, rs in by_arm.items():
        pts = one_per_load(p for r in rs if (p := point(r)) is not None)
        top = ceiling([r for r in rs if r.load.get("mode") == "saturated"])
        slo = next((s for r in rs if (s := slo_of(r)) is not None), None)
        out.append(
            ArmCurve(
                arm,
                str(rs[0].meta.get("arm_cache", "reuse")),
                pts,
                top,
                saturation_rate(pts),
                capacity(pts, slo[1] if slo else None, top),
            )
        )
    return out


def ceiling(probes: Sequence[RunResult]) -> Ceiling | None:
    """The arm's saturated throughput: of its closed-loop probes (one, or more where narrowing
    ran it again with more requests), the one with the most requests."""
    kept = max((stats.measured(r.records) for r in probes), key=len, default=Table.of([]))
    t = stats.throughput(kept)
    rate = t.steady_req_per_s or t.req_per_s
    if not rate:
        return None
    low, high = (stats.steady_rate_ci(kept) if t.steady_req_per_s else None) or (None, None)
    return Ceiling(rate, low, high, len(kept))


def one_per_load(points: Iterable[Point]) -> tuple[Point, ...]:
    """One point per load, by offered rate: where a rate was measured again with more requests
    (open_loop.RateSweep narrowing the capacity's interval), the one with the most."""
    best: dict[tuple[str, float], Point] = {}
    for p in points:
        key = (p.mode, p.offered_req_per_s)
        if key not in best or p.requests >= best[key].requests:
            best[key] = p
    return tuple(sorted(best.values(), key=lambda p: p.offered_req_per_s))


def bracket(points: Sequence[Point], share: float, by_saturation: bool = True) -> tuple[Point, Point] | None:
    """The two rates the capacity lies between: the highest that holds the SLO below the first
    that does not (None when every rate holds it or none does)."""
    pts = sorted((p for p in points if p.share_met is not None), key=lambda p: p.offered_req_per_s)
    fail = _first_failing(pts, share, by_saturation)
    return None if not fail else (pts[fail - 1], pts[fail])


def _first_failing(pts: Sequence[Point], share: float, by_saturation: bool) -> int | None:
    return next((k for k, p in enumerate(pts) if not holds(p, share, by_saturation)), None)


def width_of(c: Capacity) -> float | None:
    """A measured capacity's 95 % interval as a share of it (or the saturated throughput's,
    where that is the capacity)."""
    if c.bound not in ("measured", "saturation") or not c.req_per_s or c.low is None or c.high is None:
        return None
    return (c.high - c.low) / c.req_per_s


@dataclass(frozen=True)
class Added:
    """A load narrowing adds: the saturated probe again, or a rate, with its measured requests."""

    mode: Literal["rate", "saturated"]
    rate: float | None
    requests: int


def narrowing(curve: ArmCurve, width: float) -> list[Added] | None:
    """The loads that narrow an arm's capacity interval towards `width` of the capacity; None
    when it is that narrow already, or a bound that more loads cannot narrow (at least, below).
    Where the capacity is the saturated throughput, its probe again with twice the requests (a
    mean's interval narrows as 1/sqrt(requests)). Else the interval lies between the two rates
    around the capacity, and reaches one of them when the share meeting the SLO there is too
    uncertain to say on which side of the required share it is (its 95 % interval spans it), or,
    without a probe, when the rate above failed by saturation alone (a queue that grew through a
    short run: more requests show whether it keeps growing): that rate again, with twice the
    requests; else a rate half-way between the two, with as many requests as they had."""
    c, share = curve.capacity, curve.capacity.required_share
    w = width_of(c)
    if c.bound == "saturation" and curve.saturated is not None:  # no interval yet: more requests give one
        return None if w is not None and w <= width else [Added("saturated", None, 2 * curve.saturated.requests)]
    if w is None or share is None or w <= width:
        return None
    by_saturation = curve.saturated is None
    pair = bracket(curve.points, share, by_saturation)
    if pair is None:
        return None
    a, b = pair
    unsure = [p for p in pair if p.share_lo is not None and p.share_hi is not None and p.share_lo < share <= p.share_hi]
    if by_saturation and b not in unsure and b.saturated and (b.share_met or 0.0) >= share:
        unsure.append(b)
    if unsure:
        return [Added("rate", p.offered_req_per_s, 2 * p.requests) for p in unsure]
    return [Added("rate", (a.offered_req_per_s + b.offered_req_per_s) / 2, max(a.requests, b.requests))]


def benefit(arm_curves: Sequence[ArmCurve]) -> list[dict[str, Any]]:
    """The KV tier's benefit as SLO capacity: each reusing arm against the arm that recomputes
    everything (cache = "bust"), with the ratio's interval from the capacities' intervals."""
    base = next((c for c in arm_curves if c.cache == "bust"), None)
    if base is None:
        return []
    out = []
    for c in arm_curves:
        if c is base or c.cache == "bust":
            continue
        b, t = base.capacity, c.capacity
        ratio = lo = hi = None
        # a ratio needs the capacity without the tier measured; with it, it may be a lower bound
        if b.bound in ("measured", "saturation") and b.req_per_s and t.req_per_s and t.bound != "below":
            ratio = t.req_per_s / b.req_per_s
            lo = t.low / b.high if t.low and b.high else None
            hi = t.high / b.low if t.high and b.low else None
        out.append(
            {
                "without": base.arm,
                "with": c.arm,
                "capacity_without": b.req_per_s,
                "capacity_with": t.req_per_s,
                "bound_without": b.bound,
                "bound_with": t.bound,
                "ratio": ratio,
                "ratio_low": lo,
                "ratio_high": hi,
            }
        )
    return out


def document(runs: Sequence[RunResult]) -> dict[str, Any]:
    """capacity.json: every arm's curve and capacity, and the tier's benefit."""
    cs = curves(runs)
    return {
        "arms": [
            {
                "arm": c.arm,
                "cache": c.cache,
                "points": [asdict(p) for p in c.points],
                "saturated_req_per_s": c.saturated_req_per_s,
                "saturated_interval": [c.saturated.low, c.saturated.high] if c.saturated else None,
                "saturated_requests": c.saturated.requests if c.saturated else None,
                "saturation_rate": c.saturation_rate,
                "capacity_at_slo": asdict(c.capacity),
            }
            for c in cs
        ],
        "benefit": benefit(cs),
    }


def capacity_text(c: dict[str, Any]) -> str:
    """One arm's capacity (capacity.json's capacity_at_slo) in words."""
    share = f"{c['required_share']:.0%} of requests within the SLO"
    if c["bound"] == "below":
        return f"SLO capacity below {c['high']:.3g} req/s, the lowest rate measured ({share} at none)"
    if c["bound"] == "at_least":
        return f"SLO capacity at least {c['req_per_s']:.3g} req/s, the highest rate measured ({share} at every rate)"
    if c["bound"] == "saturation":
        interval = (
            f"95 % interval {c['low']:.3g} to {c['high']:.3g}"
            if c["low"] is not None and c["high"] is not None
            else "no interval: its probe's completions were too few or too irregular"
        ) + "; "
        return (
            f"SLO capacity {c['req_per_s']:.3g} req/s ({interval}{share}), the arm's saturated throughput: the SLO "
            "held up to it, and rates above it that met the SLO did so only because too few requests were sent "
            "for the queue to show"
        )
    return f"SLO capacity {c['req_per_s']:.3g} req/s (95 % interval {c['low']:.3g} to {c['high']:.3g}; {share})"


def _verb(b: dict[str, Any]) -> str:
    """Which way the tier moved the capacity: the sentence's verb follows the sign."""
    with_, without = b["capacity_with"], b["capacity_without"]
    if b["bound_with"] == "below" and b["bound_without"] == "below":
        return "leaves"
    if b["bound_with"] == "below":
        return "lowers"
    if b["bound_without"] == "below":
        return "raises"
    if with_ is None or without is None:
        return "changes"
    return "raises" if with_ > without else "lowers" if with_ < without else "leaves"


def sentence(b: dict[str, Any]) -> str:
    """ "the KV tier raises (or lowers) SLO capacity from X to Y req/s (Z x)", with the bounds said."""

    def cap(v: float | None, bound: str) -> str:
        if bound == "below":
            return "below the lowest rate measured"
        if v is None:
            return "unknown"
        return f"{'at least ' if bound == 'at_least' else ''}{v:.3g} req/s"

    verb = _verb(b)
    arms = f"the KV tier ({b['with']} against {b['without']})"
    if verb == "leaves":
        both = " with and without it" if b["bound_with"] == "below" else ""
        text = f"{arms} leaves SLO capacity {cap(b['capacity_with'], b['bound_with'])}{both}"
    else:
        text = (
            f"{arms} {verb} SLO capacity from "
            f"{cap(b['capacity_without'], b['bound_without'])} to {cap(b['capacity_with'], b['bound_with'])}"
        )
    if b["ratio"] is not None:
        interval = ""
        if b["ratio_low"] is not None and b["ratio_high"] is not None:
            interval = f", 95 % interval {b['ratio_low']:.3g} to {b['ratio_high']:.3g}"
        at_least = "at least " if b["bound_with"] == "at_least" else ""
        text += f" ({at_least}{b['ratio']:.3g} x{interval})"
    elif b["bound_without"] == "below" and b["capacity_with"]:
        text += " (without the tier no rate measured held the SLO)"
    return text
