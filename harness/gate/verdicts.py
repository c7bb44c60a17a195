"""Gate verdicts: each rule judged against the candidate's figures and a baseline's, noise-aware
(Mann-Whitney U on per-request samples; the baseline's run-to-run spread for run-level figures)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.analysis import stats
from harness.gate.figures import Figures
from harness.gate.rules import OPS, PER_REQUEST, Regression, Rules, Selector

ALPHA = 0.05
SPREAD_SIGMAS = 3.0


@dataclass(frozen=True)
class Verdict:
    kind: str  # "threshold" | "regression"
    metric: str
    selector: str
    rule: str
    baseline: float | None
    candidate: float | None
    change_pct: float | None
    limit: str
    verdict: str  # "pass" | "fail" | "within noise" | "missing"
    detail: str

    @property
    def name(self) -> str:
        return f"{self.metric}{self.selector} {self.rule}"


def _expand(sel: Selector, arms: list[str]) -> list[Selector]:
    if sel.arm is not None:
        return [sel]
    return [Selector(a, sel.phase, sel.length, sel.rate) for a in arms] or [sel]


def _candidate_value(fig: Figures, metric: str, sel: Selector, agg: str) -> tuple[float | None, np.ndarray | None]:
    if metric in PER_REQUEST:
        x = fig.pooled(metric, sel)
        if x is None or (len(x) == 0 and agg != "count"):
            return None, None
        return stats.aggregate(x, agg), x
    v = fig.per_run(metric, sel)
    return (float(np.mean(v)), None) if v else (None, None)


def evaluate(rules: Rules, candidate: Figures, baseline: Figures | None) -> list[Verdict]:
    out: list[Verdict] = []
    arms = candidate.arms()
    for t in rules.thresholds:
        for sel in _expand(t.selector, arms):
            value, _ = _candidate_value(candidate, t.metric, sel, t.aggregate)
            if value is None or math.isnan(value):
                verdict, detail, value = "missing", f"no {t.metric} data for {sel.text() or 'the result'}", None
            else:
                verdict = "pass" if OPS[t.op](value, t.value) else "fail"
                detail = f"{t.aggregate} = {value:.6g}, must be {t.op} {t.value:g}"
            out.append(Verdict("threshold", t.metric, sel.text(), t.text, None, value, None, t.text, verdict, detail))
    for r in rules.regressions:
        for sel in _expand(r.selector, arms):
            out.append(_regression(r, sel, candidate, baseline, rules.noise))
    return out


def _regression(r: Regression, sel: Selector, cand: Figures, base: Figures | None, noise: str) -> Verdict:
    limit = f"{r.limit_pct:+g}%"

    def verdict(v: str, b: float | None, c: float | None, change: float | None, detail: str) -> Verdict:
        return Verdict("regression", r.metric, sel.text(), r.text, b, c, change, limit, v, detail)

    if base is None:
        return verdict("missing", None, None, None, "no baseline given (--baseline)")
    c_val, c_samples = _candidate_value(cand, r.metric, sel, r.aggregate)
    b_val, b_samples = _candidate_value(base, r.metric, sel, r.aggregate)
    if c_val is None or b_val is None:
        side = "candidate" if c_val is None else "baseline"
        return verdict("missing", b_val, c_val, None, f"no {r.metric} data in the {side} for {sel.text() or 'it'}")
    if b_val == 0:
        change = 0.0 if c_val == 0 else math.copysign(math.inf, c_val)
    else:
        change = (c_val - b_val) / abs(b_val) * 100
    beyond = change > r.limit_pct if r.limit_pct >= 0 else change < r.limit_pct
    if not beyond:
        return verdict("pass", b_val, c_val, change, f"change {change:+.1f}% within {limit}")
    if noise == "none":
        return verdict("fail", b_val, c_val, change, f"change {change:+.1f}% beyond {limit}")
    if r.metric in PER_REQUEST:
        assert c_samples is not None and b_samples is not None
        p = stats.mann_whitney_p(list(b_samples), list(c_samples))
        if p is None:
            return verdict(
                "within noise",
                b_val,
                c_val,
                change,
                f"change {change:+.1f}% beyond {limit}, but too few samples to tell it from noise",
            )
        if p < ALPHA:
            return verdict(
                "fail", b_val, c_val, change, f"change {change:+.1f}% beyond {limit}, significant (p={p:.2g})"
            )
        return verdict(
            "within noise", b_val, c_val, change, f"change {change:+.1f}% beyond {limit}, but within noise (p={p:.2g})"
        )
    runs = base.per_run(r.metric, sel) or []
    if len(runs) >= 2:
        sd = float(np.std(runs, ddof=1))
        if abs(c_val - b_val) <= SPREAD_SIGMAS * sd:
            return verdict(
                "within noise",
                b_val,
                c_val,
                change,
                f"change {change:+.1f}% beyond {limit}, but within {SPREAD_SIGMAS:g} sd of the "
                f"baseline's {len(runs)} runs",
            )
        return verdict(
            "fail",
            b_val,
            c_val,
            change,
            f"change {change:+.1f}% beyond {limit} and outside the baseline's spread ({len(runs)} runs)",
        )
    return verdict(
        "fail",
        b_val,
        c_val,
        change,
        f"change {change:+.1f}% beyond {limit} (the baseline holds one run: judged by the limit alone)",
    )
