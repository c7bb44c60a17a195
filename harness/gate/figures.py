"""What gate rules are checked against: `Figures` of result folders or of a baseline.

Per-request samples per (arm, phase, length), failures per group, and per-run values per arm
(one per run; a baseline may hold several runs), all from the statistics core.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness import stats
from harness.gate.rules import Selector
from harness.results import RunResult


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


def of_runs(runs: list[RunResult]) -> Figures:
    fig = Figures()
    for run in runs:
        for (phase, length), g in stats.groups(run.records, ("phase", "target_tokens")).items():
            key = (run.arm, str(phase), length)
            entry = fig.samples.setdefault(key, {})
            for m in stats.PER_REQUEST:
                entry[m] = np.concatenate([entry.get(m, np.array([])), stats.values(g, m)])
            failed, total = fig.errors.get(key, (0, 0))
            fig.errors[key] = (failed + sum(not r.ok for r in g), total + len(g))
        for (metric, length), value in run_level(run).items():
            fig.run_values.setdefault((run.arm, metric, length), []).append(value)
    return fig


def run_level(run: RunResult) -> dict[tuple[str, int | None], float]:
    """The figures a run gives once: throughput for a closed loop, speedup per length for a sweep."""
    out: dict[tuple[str, int | None], float] = {}
    if run.kind == "sweep":
        for row in stats.sweep_rows(run.records):
            if row["speedup"]:
                out[("speedup", int(row["length"]))] = float(row["speedup"])
        return out
    t = stats.throughput(run.records)
    for name, v in (
        ("req_per_s", t.req_per_s),
        ("steady_req_per_s", t.steady_req_per_s),
        ("output_tokens_per_s", t.output_tokens_per_s),
    ):
        if v is not None:
            out[(name, None)] = v
    return out
