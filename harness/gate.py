"""Gate rules and verdicts: pure functions, no I/O.

Grammar of a rule (documented in docs/ci.md):

    rule       ::= key "=" ( threshold-list | regression-table )
    key        ::= metric [ "{" selector { "," selector } "}" ]
    metric     ::= "ttft_s" | "first_byte_s" | "first_content_s" | "e2e_s" | "itl_s"     (per request)
                 | "req_per_s" | "steady_req_per_s" | "output_tokens_per_s" | "speedup" | "error_rate"  (per run)
    selector   ::= ( "arm" | "phase" ) "=" name | "length" "=" integer
    threshold  ::= aggregate op number          e.g. "p99 < 1.0"
    aggregate  ::= "mean" | "p50" | "p90" | "p95" | "p99" | "min" | "max" | "count"   (per-request metrics)
                 | "value" | "rate"                                                    (per-run metrics)
    op         ::= "<" | "<=" | ">" | ">=" | "==" | "!="
    regression-table ::= "{" aggregate "=" limit { "," aggregate "=" limit } "}"
    limit      ::= ( "+" | "-" ) number "%"       "+10%": may rise at most 10 %; "-5%": may fall at most 5 %

A rule without an `arm` selector is checked for every arm of the result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness import stats
from harness.errors import InputError

PER_REQUEST = ("ttft_s", "first_byte_s", "first_content_s", "e2e_s", "itl_s")
PER_RUN = ("req_per_s", "steady_req_per_s", "output_tokens_per_s", "speedup", "error_rate")
REQUEST_AGGREGATES = ("mean", "p50", "p90", "p95", "p99", "min", "max", "count")
RUN_AGGREGATES = ("value", "rate")
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12),
    "!=": lambda a, b: not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12),
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}
ALPHA = 0.05
SPREAD_SIGMAS = 3.0

_KEY_RE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?:\{([^{}]*)\})?\s*$")
_THRESHOLD_RE = re.compile(r"^\s*([a-z0-9]+)\s*(<=|>=|==|!=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")
_LIMIT_RE = re.compile(r"^\s*([+-])\s*(\d+\.?\d*|\.\d+)\s*%\s*$")


@dataclass(frozen=True)
class Selector:
    arm: str | None = None
    phase: str | None = None
    length: int | None = None

    def text(self) -> str:
        parts = [f"{k}={v}" for k, v in (("arm", self.arm), ("phase", self.phase), ("length", self.length)) if v]
        return "{" + ",".join(parts) + "}" if parts else ""


@dataclass(frozen=True)
class Threshold:
    key: str
    metric: str
    selector: Selector
    aggregate: str
    op: str
    value: float
    text: str


@dataclass(frozen=True)
class Regression:
    key: str
    metric: str
    selector: Selector
    aggregate: str
    limit_pct: float  # signed: +10 = may rise 10 %, -5 = may fall 5 %
    text: str


@dataclass(frozen=True)
class Rules:
    thresholds: tuple[Threshold, ...] = ()
    regressions: tuple[Regression, ...] = ()
    noise: str = "significant"

    def __bool__(self) -> bool:
        return bool(self.thresholds or self.regressions)


def parse_key(key: str, where: str) -> tuple[str, Selector]:
    m = _KEY_RE.match(key)
    if not m:
        raise InputError(f"{where}: rule {key!r}: expected metric or metric{{name=value,...}}")
    metric, sel_text = m.group(1), m.group(2)
    if metric not in PER_REQUEST + PER_RUN:
        raise InputError(
            f"{where}: rule {key!r}: unknown metric {metric!r} (known: {', '.join(PER_REQUEST + PER_RUN)})"
        )
    found: dict[str, Any] = {}
    for part in (sel_text or "").split(","):
        if not part.strip():
            continue
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not value or name not in ("arm", "phase", "length"):
            raise InputError(f"{where}: rule {key!r}: bad selector {part.strip()!r} (expected arm=, phase= or length=)")
        if name in found:
            raise InputError(f"{where}: rule {key!r}: selector {name!r} given twice")
        if name == "length":
            if not value.isdigit():
                raise InputError(f"{where}: rule {key!r}: length must be an integer number of tokens, got {value!r}")
            found[name] = int(value)
        else:
            found[name] = value
    if metric == "speedup" and found.get("phase"):
        raise InputError(f"{where}: rule {key!r}: speedup compares cold with warm; it takes no phase")
    return metric, Selector(**found)


def _check_aggregate(metric: str, agg: str, key: str, where: str) -> None:
    allowed = REQUEST_AGGREGATES if metric in PER_REQUEST else RUN_AGGREGATES
    if agg not in allowed:
        raise InputError(
            f"{where}: rule {key!r}: aggregate {agg!r} does not apply to {metric} (use {', '.join(allowed)})"
        )


def parse_rules(table: dict[str, Any], where: str) -> Rules:
    """The `[gate]` table of a scenario or rules file. Raises InputError naming the bad rule."""
    unknown = set(table) - {"thresholds", "regression"}
    if unknown:
        raise InputError(f"{where}: gate.{sorted(unknown)[0]}: unknown key (known: thresholds, regression)")
    thresholds: list[Threshold] = []
    raw_t = table.get("thresholds") or {}
    if not isinstance(raw_t, dict):
        raise InputError(f"{where}: gate.thresholds: expected a table of rules")
    for key, exprs in raw_t.items():
        metric, sel = parse_key(key, where)
        if isinstance(exprs, str):
            exprs = [exprs]
        if not isinstance(exprs, list) or not exprs or not all(isinstance(e, str) for e in exprs):
            raise InputError(f'{where}: rule {key!r}: expected a list of strings such as ["p50 < 0.6"]')
        for e in exprs:
            m = _THRESHOLD_RE.match(e)
            if not m:
                raise InputError(f"{where}: rule {key!r}: {e!r}: expected 'aggregate op number', e.g. 'p99 < 1.0'")
            _check_aggregate(metric, m.group(1), key, where)
            thresholds.append(Threshold(key, metric, sel, m.group(1), m.group(2), float(m.group(3)), e.strip()))
    regressions: list[Regression] = []
    raw_r = table.get("regression") or {}
    if not isinstance(raw_r, dict):
        raise InputError(f"{where}: gate.regression: expected a table of rules")
    noise = raw_r.get("noise", "significant")
    if noise not in ("significant", "none"):
        raise InputError(f'{where}: gate.regression.noise: expected "significant" or "none", got {noise!r}')
    for key, limits in raw_r.items():
        if key == "noise":
            continue
        metric, sel = parse_key(key, where)
        if not isinstance(limits, dict) or not limits:
            raise InputError(f'{where}: rule {key!r}: expected a table such as {{ p50 = "+10%" }}')
        for agg, lim in limits.items():
            _check_aggregate(metric, agg, key, where)
            m = _LIMIT_RE.match(lim) if isinstance(lim, str) else None
            if not m:
                raise InputError(f'{where}: rule {key!r}: {agg} = {lim!r}: expected a signed percentage such as "+10%"')
            pct = float(m.group(2)) * (1 if m.group(1) == "+" else -1)
            regressions.append(Regression(key, metric, sel, agg, pct, f"{agg} {m.group(1)}{m.group(2)}%"))
    return Rules(tuple(thresholds), tuple(regressions), noise)


def merge(base: Rules, override: Rules) -> Rules:
    """Rules from a file win over the scenario's for the same metric key and aggregate."""
    t_keys = {(t.key, t.aggregate) for t in override.thresholds}
    r_keys = {(r.key, r.aggregate) for r in override.regressions}
    return Rules(
        tuple(t for t in base.thresholds if (t.key, t.aggregate) not in t_keys) + override.thresholds,
        tuple(r for r in base.regressions if (r.key, r.aggregate) not in r_keys) + override.regressions,
        override.noise if override.regressions else base.noise,
    )


# --- figures ---------------------------------------------------------------------------------


@dataclass
class Figures:
    """What a rule can be checked against: per-request samples per (arm, phase, length) and
    per-run values per arm (one per run; a baseline may hold several runs)."""

    samples: dict[tuple[str, str, int | None], dict[str, np.ndarray]] = field(default_factory=dict)
    errors: dict[tuple[str, str, int | None], tuple[int, int]] = field(default_factory=dict)  # (failed, total)
    run_values: dict[tuple[str, str, int | None], list[float]] = field(default_factory=dict)  # (arm, metric, length)

    def arms(self) -> list[str]:
        return sorted({k[0] for k in self.samples} | {k[0] for k in self.run_values})

    def pooled(self, metric: str, sel: Selector) -> np.ndarray | None:
        parts = [v[metric] for k, v in self.samples.items() if _matches(k, sel) and metric in v]
        return np.concatenate(parts) if parts else None

    def per_run(self, metric: str, sel: Selector) -> list[float] | None:
        if metric == "error_rate":
            sel_err = [v for k, v in self.errors.items() if _matches(k, sel)]
            if not sel_err:
                return None
            failed, total = sum(f for f, _ in sel_err), sum(t for _, t in sel_err)
            return [failed / total] if total else None
        return self.run_values.get((sel.arm or "", metric, sel.length))


def _matches(key: tuple[str, str, int | None], sel: Selector) -> bool:
    arm, phase, length = key
    return (
        (sel.arm is None or sel.arm == arm)
        and (sel.phase is None or sel.phase == phase)
        and (sel.length is None or sel.length == length)
    )


def aggregate(x: np.ndarray, agg: str) -> float:
    if agg == "count":
        return float(len(x))
    if len(x) == 0:
        return math.nan
    if agg == "mean":
        return float(np.mean(x))
    if agg == "min":
        return float(np.min(x))
    if agg == "max":
        return float(np.max(x))
    return float(np.percentile(x, float(agg[1:])))


# --- verdicts --------------------------------------------------------------------------------


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
    return [Selector(a, sel.phase, sel.length) for a in arms] or [sel]


def _candidate_value(fig: Figures, metric: str, sel: Selector, agg: str) -> tuple[float | None, np.ndarray | None]:
    if metric in PER_REQUEST:
        x = fig.pooled(metric, sel)
        if x is None or (len(x) == 0 and agg != "count"):
            return None, None
        return aggregate(x, agg), x
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
