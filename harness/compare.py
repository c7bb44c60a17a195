"""`kvbench compare BASE CANDIDATE`: each figure of two runs side by side, asv-compare style."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from harness import analysis, stats
from harness.report.load import LoadedRun

ALPHA = 0.05


@dataclass(frozen=True)
class Row:
    run: str
    figure: str
    base: float | None
    candidate: float | None
    ratio: float | None
    verdict: str


def _samples(run: LoadedRun, phase: str, length: Any, metric: str) -> np.ndarray:
    df = run.df
    sel = df[(df["ok"] == True) & (df["phase"] == phase)]  # noqa: E712
    if length is not None:
        sel = sel[sel["target_tokens"] == length]
    return sel[metric].dropna().to_numpy(dtype=float)


def compare(base: list[LoadedRun], cand: list[LoadedRun]) -> list[Row]:
    rows: list[Row] = []
    by_label = {r.label: r for r in cand}
    for b in base:
        c = by_label.get(b.label)
        if c is None:
            continue
        groups = sorted(
            {(p, t) for p, t in zip(b.df["phase"], b.df["target_tokens"], strict=True)},
            key=lambda x: (str(x[0]), x[1] or 0),
        )
        for phase, length in groups:
            where = f"{phase}" + (f" @ {int(length):,}" if length == length and length is not None else "")
            for metric in ("ttft_s", "e2e_s"):
                x, y = _samples(b, phase, length, metric), _samples(c, phase, length, metric)
                if len(x) == 0 or len(y) == 0:
                    continue
                p = stats.mann_whitney_p(list(x), list(y))
                for q in (50, 99):
                    bv, cv = float(np.percentile(x, q)), float(np.percentile(y, q))
                    verdict = (
                        "n/a (too few samples)"
                        if p is None
                        else (
                            ("slower" if cv > bv else "faster") + f" (significant, p={p:.2g})"
                            if p < ALPHA
                            else f"within noise (p={p:.2g})"
                        )
                    )
                    rows.append(Row(b.label, f"{metric} p{q} {where}", bv, cv, cv / bv if bv else None, verdict))
        if b.kind == "closed_loop":
            bv2, cv2 = analysis.closed_loop(b.df).req_per_s, analysis.closed_loop(c.df).req_per_s
            rows.append(
                Row(
                    b.label,
                    "req/s",
                    bv2,
                    cv2,
                    cv2 / bv2 if bv2 and cv2 else None,
                    "one value per run: repeat runs to judge noise",
                )
            )
    return rows
