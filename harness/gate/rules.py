"""Gate rules: the grammar and its parser (pure, no I/O).

Grammar of a rule (documented in docs/ci.md):

    rule       ::= key "=" ( threshold-list | regression-table )
    key        ::= metric [ "{" selector { "," selector } "}" ]
    metric     ::= "ttft_s" | "request_ttft_s" | "first_byte_s" | "first_content_s" | "e2e_s" | "itl_s"
                 | "tpot_s"                                                            (per request)
                 | "req_per_s" | "steady_req_per_s" | "output_tokens_per_s" | "speedup" | "error_rate"
                 | "goodput_req_per_s" | "slo_share_met"                    (per run; open loop: per rate)
                 | "capacity_at_slo"                                        (per open-loop arm)
                 | "sized_ttft_p99_s" | "sized_g4_share" | ...   (per configuration of a sizing: docs/ci.md)
    selector   ::= ( "arm" | "phase" ) "=" name | "length" "=" integer | "rate" "=" number
    threshold  ::= aggregate op number          e.g. "p99 < 1.0"
    aggregate  ::= "mean" | "p50" | "p90" | "p95" | "p99" | "min" | "max" | "count"   (per-request metrics)
                 | "value" | "rate"                                                    (per-run metrics)
    op         ::= "<" | "<=" | ">" | ">=" | "==" | "!="
    regression-table ::= "{" aggregate "=" limit { "," aggregate "=" limit } "}"
    limit      ::= ( "+" | "-" ) number "%"       "+10%": may rise at most 10 %; "-5%": may fall at most 5 %

A rule without an `arm` selector is checked for every arm of the result. `rate` picks an open
loop's result folder at that offered rate (req/s, as the scenario lists it); without it a
per-request rule pools every rate of the arm.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.analysis.stats import PER_REQUEST
from harness.config import kinds
from harness.config.scenario import Scenario
from harness.core.errors import InputError
from harness.sizing.result import METRICS as SIZED

PER_RUN = (
    "req_per_s",
    "steady_req_per_s",
    "output_tokens_per_s",
    "speedup",
    "error_rate",
    "goodput_req_per_s",
    "slo_share_met",
    "capacity_at_slo",
)
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

_KEY_RE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s*(?:\{([^{}]*)\})?\s*$")
_THRESHOLD_RE = re.compile(
    r"^\s*([a-z0-9]+)\s*(<=|>=|==|!=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$", re.ASCII
)
_LIMIT_RE = re.compile(r"^\s*([+-])\s*(\d+\.?\d*|\.\d+)\s*%\s*$", re.ASCII)


@dataclass(frozen=True)
class Selector:
    arm: str | None = None
    phase: str | None = None
    length: int | None = None
    rate: float | None = None

    def text(self) -> str:
        pairs = (("arm", self.arm), ("phase", self.phase), ("length", self.length), ("rate", self.rate))
        parts = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in pairs if v]
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

    @property
    def metrics(self) -> frozenset[str]:
        return frozenset(t.metric for t in self.thresholds) | {r.metric for r in self.regressions}


def parse_key(key: str, where: str) -> tuple[str, Selector]:
    m = _KEY_RE.match(key)
    if not m:
        raise InputError(f"{where}: rule {key!r}: expected metric or metric{{name=value,...}}")
    metric, sel_text = m.group(1), m.group(2)
    if metric not in PER_REQUEST + PER_RUN + SIZED and metric not in (known := kinds.gate_metrics()):
        names = ", ".join(PER_REQUEST + PER_RUN + known + SIZED)
        raise InputError(f"{where}: rule {key!r}: unknown metric {metric!r} (known: {names})")
    found: dict[str, Any] = {}
    for part in (sel_text or "").split(","):
        if not part.strip():
            continue
        name, eq, value = (s.strip() for s in part.partition("="))
        if not eq or not value or name not in ("arm", "phase", "length", "rate"):
            raise InputError(
                f"{where}: rule {key!r}: bad selector {part.strip()!r} (expected arm=, phase=, length= or rate=)"
            )
        if name in found:
            raise InputError(f"{where}: rule {key!r}: selector {name!r} given twice")
        if name == "length":
            if not (value.isascii() and value.isdigit()):
                raise InputError(f"{where}: rule {key!r}: length must be an integer number of tokens, got {value!r}")
            found[name] = int(value)
        elif name == "rate":
            try:
                found[name] = float(value)
            except ValueError:
                found[name] = math.nan
            if not math.isfinite(found[name]) or found[name] <= 0:
                raise InputError(f"{where}: rule {key!r}: rate must be requests per second > 0, got {value!r}")
        else:
            found[name] = value
    if metric == "capacity_at_slo" and (found.get("rate") or found.get("phase") or found.get("length")):
        raise InputError(f"{where}: rule {key!r}: capacity_at_slo is one figure per arm; it takes only arm=")
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
            if not math.isfinite(limit := float(m.group(3))):
                raise InputError(f"{where}: rule {key!r}: {e.strip()!r}: expected a finite number")
            thresholds.append(Threshold(key, metric, sel, m.group(1), m.group(2), limit, e.strip()))
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


def check_rules(sc: Scenario) -> None:
    """A scenario's [gate] table read as the gate reads it: its errors before anything runs."""
    if sc.gate is not None:
        parse_rules(sc.gate, sc.path)
