"""What gate rules are checked against: `Figures` of result folders or of a baseline.

Per-request samples per (arm, phase, length, rate), failures per group, and per-run values per
(arm, metric, length, rate) (one per run; a baseline may hold several runs), all from the
statistics core; an open loop's rate is its folder's offered rate, None elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from harness.analysis import capacity, stats
from harness.analysis.kinds import figures_of
from harness.gate.rules import Selector
from harness.results import RunResult
from harness.sizing import result as sizing
from harness.sizing.result import Sizing

Key = tuple[str, str, int | None, float | None]
RATE_MATCH = 5e-4  # a rule's rate= picks the folder whose offered rate is within this share of it


@dataclass
class Figures:
    """What a rule can be checked against: per-request samples per (arm, phase, length) and
    per-run values per arm (one per run; a baseline may hold several runs)."""

    samples: dict[Key, dict[str, np.ndarray]] = field(default_factory=dict)
    errors: dict[Key, tuple[int, int]] = field(default_factory=dict)  # (failed, total)
    run_values: dict[Key, list[float]] = field(default_factory=dict)  # (arm, metric, length, rate)
    notes: list[str] = field(default_factory=list)  # what the figures are of, where not every request

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
        return next(
            (
                v
                for (a, m, n, r), v in self.run_values.items()
                if (a, m, n) == (sel.arm or "", metric, sel.length) and _same_rate(r, sel.rate)
            ),
            None,
        )


def _same_rate(rate: float | None, wanted: float | None) -> bool:
    if wanted is None or rate is None:
        return wanted is None and rate is None
    return abs(rate - wanted) <= RATE_MATCH * wanted  # as folder names show it: 4 significant digits


def _matches(key: Key, sel: Selector) -> bool:
    arm, phase, length, rate = key
    return (
        (sel.arm is None or sel.arm == arm)
        and (sel.phase is None or sel.phase == phase)
        and (sel.length is None or sel.length == length)
        and (sel.rate is None or _same_rate(rate, sel.rate))
    )


def of_runs(
    runs: list[RunResult], metrics: Iterable[str] = stats.PER_REQUEST, gaps_held: int = stats.GAPS_HELD
) -> Figures:
    """The runs' figures: every run-level one, and the per-request samples of `metrics` (those a
    gate's rules judge: a day-long run's samples of every metric need not be held at once); a
    run's ITL from at most about `gaps_held` of its token gaps."""
    wanted = [m for m in stats.PER_REQUEST if m in set(metrics)]
    fig = Figures()
    for run in runs:
        rate = run.rate if run.load.get("mode") == "rate" else None
        every = stats.gaps_every(stats.ok(run.records), gaps_held) if "itl_s" in wanted else 1
        if every > 1:
            fig.notes.append(
                f"{run.label}: itl_s from the token gaps of 1 request in {every} (the run has more than "
                f"{gaps_held:,} gaps)"
            )
        for (phase, length), g in stats.groups(run.records, ("phase", "target_tokens")).items():
            key = (run.arm, str(phase), length, rate)
            entry = fig.samples.setdefault(key, {})
            for m in wanted:
                got = stats.gaps(stats.ok(g), every) if m == "itl_s" else stats.values(g, m)
                entry[m] = np.concatenate([entry.get(m, np.array([])), got])
            failed, total = fig.errors.get(key, (0, 0))
            fig.errors[key] = (failed + len(g) - len(stats.ok(g)), total + len(g))
        for (metric, length), value in run_level(run).items():
            fig.run_values.setdefault((run.arm, metric, length, rate), []).append(value)
    for curve in capacity.curves(runs):
        if curve.capacity.req_per_s is not None:
            fig.run_values.setdefault((curve.arm, "capacity_at_slo", None, None), []).append(curve.capacity.req_per_s)
    return fig


def of_sizing(s: Sizing) -> Figures:
    """A sizing result's figures, one value per configuration (its label as the arm)."""
    fig = Figures()
    for arm, values in sizing.gate_values(s).items():
        for metric, value in values.items():
            fig.run_values.setdefault((arm, metric, None, None), []).append(value)
    return fig


def run_level(run: RunResult) -> dict[tuple[str, int | None], float]:
    """The figures a run gives once, as its workload kind says: throughput for a closed loop,
    speedup per length for a sweep, goodput beside the throughput for an open loop."""
    return figures_of(run.kind).gate_figures(run)
