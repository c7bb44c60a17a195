"""`kind = "sweep"`'s figures: TTFT per prompt length, cold against warm, and the speed-up per
length for the gate; its report section (the medians and speed-ups by length, the published
points beside them, the restores, the cost-model fit and break-even length), its key figure and
the claims audit's TTFT speed-up."""

from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table as RichTable

from harness.analysis import findings, stats, wording
from harness.analysis.kinds import Figures, GateFigures, restore_parts
from harness.analysis.kinds.document import Card, Heading, Line, Lines, Mark, Paragraph, Part, Published, Section, Table
from harness.config import reference
from harness.config.reference import redbooks
from harness.results import RunResult

LATE_MARK = "!"  # beside a row the emulator ran late in
SPEEDUP_READ = (
    "How to read this: speedup = cold median TTFT / warm median TTFT at each length; the band is its 95 % "
    "bootstrap interval. Loading KV pays off more as prompts grow, because recompute cost grows faster than "
    "linearly."
)
FIT_READ = (
    "How to read this: cold TTFT is fitted as a*n + b*n^2 (compute grows with the prompt, attention with its "
    "square); warm TTFT as c + n/r (a fixed latency plus a transfer at r tokens per second). r times the model's "
    "KV bytes per token is the effective bandwidth of the tier as one request saw it. Below the break-even length "
    "recomputing is faster than loading. The residual table shows how well each fit holds."
)
RESTORED_READ = (
    "Warm TTFT here includes the restore kvbench performed before each warm request: the whole cost of coming "
    "back from disk, as a host tier's restore is inside its requests (the request alone: the restore table below)."
)
COLUMNS = ("prompt tokens", "cold n", "cold median (s)", "warm n", "warm median (s)", "speedup", "95 % interval")


def _read() -> str:
    lo, hi = redbooks()["ttft"]["cached_s_range"]
    return (
        "How to read this: each point is the median time to first token at one prompt length; cold requests "
        "recompute the whole prompt, warm ones find its KV cache. Bars are 95 % bootstrap intervals of the median. "
        f"Black crosses are the published figures (warm: the published range {lo:g} to {hi:g} s, placed at the "
        "shortest and longest length). The y axis is logarithmic."
    )


class SweepFigures(Figures):
    def summary(self, records: stats.Records, slo: dict[str, float] | None = None) -> dict[str, Any]:
        return {**stats.summary(records), "by_length": stats.sweep_rows(records)}

    def show(self, console: Console, heading: str, s: dict[str, Any], unit: str) -> None:
        t = RichTable(title=f"{heading}: TTFT by prompt length{unit}")
        for col in ("tokens", "cold p50 s", "warm p50 s", "speedup", "n cold/warm"):
            t.add_column(col, justify="right")
        for row in s["by_length"]:
            t.add_row(
                f"{row['length']:,}{LATE_MARK if row.get('emulator_late') else ''}",
                wording.fmt(row["cold_ttft_p50_s"]),
                wording.fmt(row["warm_ttft_p50_s"]),
                f"{row['speedup']:.1f}x" if row["speedup"] else "-",
                f"{row['cold_n']}/{row['warm_n']}",
            )
        console.print(t)
        if any(row.get("emulator_late") for row in s["by_length"]):
            console.print(f"  {LATE_MARK}: {wording.LATE_ROWS}", markup=False)
        if s.get("ttft_includes_restore"):
            console.print(f"  {stats.RESTORE_NOTE}", markup=False)

    def warnings(self, s: dict[str, Any]) -> list[str]:
        where = wording.late_rows(s["by_length"])
        return [f"the emulator ran behind its model at {where}: {wording.LATE_ROWS}"] if where else []

    def gate_figures(self, run: RunResult) -> GateFigures:
        """The speedup per length."""
        return {
            ("speedup", int(row["length"])): float(row["speedup"])
            for row in stats.sweep_rows(run.records)
            if row["speedup"]
        }

    def claimed(self, run: RunResult) -> dict[str, float]:
        """The speedup at the published length (the audit's `ttft_speedup_max`), where measured."""
        n = reference.ttft_speedup_length()
        at = [r["speedup"] for r in stats.sweep_rows(run.records) if r["length"] == n and r["speedup"]]
        return {"ttft_speedup_max": float(at[0])} if at else {}

    def cards(self, runs: list[RunResult]) -> list[Card]:
        """The speedup at the published length beside the paper's; where no run measured it, the
        first run's at its longest length."""
        for run in runs:
            if got := self.claimed(run):
                n = reference.ttft_speedup_length()
                published = f"{redbooks()['claims']['ttft_speedup']}x"
                return [Card(f"TTFT speedup at {n // 1000}K tokens", f"{got['ttft_speedup_max']:.1f}x", published)]
        rows = stats.sweep_rows(runs[0].records) if runs else []
        if not rows or not rows[-1]["speedup"]:
            return []
        restored = " (restore included)" if findings.restores(runs[0].records) else ""
        return [Card(f"TTFT speedup at {rows[-1]['length']:,} tokens{restored}", f"{rows[-1]['speedup']:.1f}x")]

    def sections(self, runs: list[RunResult]) -> list[Section]:
        return [by_length(run) for run in runs]


def by_length(run: RunResult) -> Section:
    """A run's TTFT against prompt length, cold and warm, with the published points, the speedup,
    the restores kvbench made and the cost model fitted to it."""
    rows = stats.sweep_rows(run.records, intervals=True)
    paper = _paper() if run.reference_test == "ttft" else ()
    published = tuple(Published(n, v, f"{label} {v:g} s", below=label == "warm") for label, n, v in paper)
    restores = findings.restores(run.records)
    tiers = run.meta.get("tiers") if isinstance(run.meta.get("tiers"), dict) else None
    parts: list[Part] = [Paragraph(RESTORED_READ, "read")] if restores else []
    medians = _medians(findings.group_stats(stats.ok(run.records), by=("phase", "target_tokens")))
    if medians:
        caption = "Median TTFT, cold and warm. Numbers in the table below."
        x_label, y_label = "prompt length (tokens)", "TTFT, median (s, log scale)"
        parts.append(Lines(caption, x_label, y_label, medians, published=published, logy=True))
    parts.append(_table(rows))
    if late := wording.late_rows(rows):
        parts.append(Paragraph(f"{LATE_MARK} At {late}: {wording.LATE_ROWS}.", "warning"))
    if paper:
        parts.append(Table(("published point", "prompt tokens", "TTFT (s)"), paper, digits=4))
    if tiers:
        parts.append(Paragraph(_tiers_text(tiers), "read"))
    if restores:
        parts += restore_parts(restores, tiers)
    parts += [Heading("Speedup vs prompt length"), Paragraph(SPEEDUP_READ, "read")]
    if rows:
        parts.append(_speedups(rows, run.reference_test == "ttft"))
    # KV bytes per token: the scenario's, else what the engine's restores read, else the paper's model's
    engine_kv = restores["kv_bytes_per_token"] if restores else None
    kv = int(run.scenario.get("model", {}).get("kv_bytes_per_token") or engine_kv or reference.kv_bytes_per_token())
    if fit := findings.fit_cost_model(run.records, kv):
        parts += _fit(fit)
    return Section(f"TTFT vs prompt length: {run.label}", _read(), parts=tuple(parts))


def _paper() -> tuple[tuple[str, int, float], ...]:
    """The paper's TTFT points, (phase, prompt tokens, seconds): cold at its shortest and longest
    length, and its warm range placed at them."""
    t = redbooks()["ttft"]
    lo_n, hi_n = int(t["prompt_tokens_min"]), int(t["prompt_tokens_max"])
    cold = [float(t["no_cache_s"][str(n)]) for n in (lo_n, hi_n)]
    warm = [float(v) for v in t["cached_s_range"]]
    return tuple(
        (label, n, v)
        for label, values in (("cold", cold), ("warm", warm))
        for n, v in zip((lo_n, hi_n), values, strict=True)
    )


def _medians(groups: list[dict[str, Any]]) -> tuple[Line, ...]:
    out: list[Line] = []
    for phase in ("cold", "warm"):
        g = sorted((row for row in groups if row["phase"] == phase), key=lambda row: row["target_tokens"])
        if not g:
            continue
        lo, hi = [row["ttft_s_p50_ci_lo"] for row in g], [row["ttft_s_p50_ci_hi"] for row in g]
        known = all(v is not None for v in lo)
        x = tuple(float(row["target_tokens"]) for row in g)
        y = tuple(row["ttft_s_p50"] for row in g)
        out.append(Line(phase, x, y, len(out), tuple(lo) if known else (), tuple(hi) if known else ()))
    return tuple(out)


def _table(rows: list[dict[str, Any]]) -> Table:
    def speedup(r: dict[str, Any]) -> str:
        return f"{wording.num(r['speedup'])}x" if r["speedup"] else "-"

    def interval(r: dict[str, Any]) -> str:
        return f"{wording.num(r['speedup_ci_lo'])} to {wording.num(r['speedup_ci_hi'])}" if r["speedup_ci_lo"] else "-"

    cells = tuple(
        (
            f"{r['length']:,} {LATE_MARK}" if r.get("emulator_late") else r["length"],
            r["cold_n"],
            r["cold_ttft_p50_s"],
            r["warm_n"],
            r["warm_ttft_p50_s"],
            speedup(r),
            interval(r),
        )
        for r in rows
    )
    return Table(COLUMNS, cells, digits=4, marked=tuple(i for i, r in enumerate(rows) if r.get("emulator_late")))


def _tiers_text(tiers: dict[str, Any]) -> str:
    how = (
        "in the engine's host-memory prompt cache: before each, another prompt took the slot (pushed it out)"
        if tiers.get("warm_from") == "host"
        else "restored from a file: the slot was saved once after the cold request, then erased and restored from "
        "the file before each warm request"
    )
    real = "a real engine and real storage" if tiers.get("warm_from") == "disk" else "a real engine"
    slots = ", ".join(str(s) for s in tiers.get("slots") or ())
    text = f"Warm requests of this arm found their KV {how} ({tiers.get('engine')}, slot {slots}; {real})."
    return text + (f" Page cache: {tiers['page_cache']}." if tiers.get("page_cache") else "")


def _speedups(rows: list[dict[str, Any]], paper: bool) -> Lines:
    lo, hi = [r["speedup_ci_lo"] for r in rows], [r["speedup_ci_hi"] for r in rows]
    known = all(v is not None for v in lo)
    line = Line(
        "measured (cold / warm median)",
        tuple(float(r["length"]) for r in rows),
        tuple(r["speedup"] for r in rows),
        lo=tuple(lo) if known else (),
        hi=tuple(hi) if known else (),
        band="95 % interval",
    )
    claimed = float(redbooks()["claims"]["ttft_speedup"])
    published = (Published(reference.ttft_speedup_length(), claimed, f"{claimed:g}x"),) if paper else ()
    caption = "Speedup by prompt length (values in the table above)."
    return Lines(caption, "prompt length (tokens)", "speedup (x)", (line,), published=published)


def _fit(fit: findings.CostFit) -> list[Part]:
    """The fitted recompute and load curves over the measured points, the break-even length, the
    parameters and the residuals."""

    def measured(phase: str) -> tuple[tuple[float, ...], tuple[float | None, ...]]:
        rows = [r for r in fit.residuals if r["phase"] == phase]
        return tuple(r["tokens"] for r in rows), tuple(r["measured_s"] for r in rows)

    cold, warm = measured("cold"), measured("warm")
    top = max(cold[0] + warm[0]) * 1.05
    n = np.linspace(0, top, 200)
    x = tuple(n.tolist())
    recompute, load = tuple((fit.a * n + fit.b * n * n).tolist()), tuple((fit.c + fit.s_per_token * n).tolist())
    lines = (
        Line("cold (measured)", *cold, style=1, draw="points"),
        Line("warm (measured)", *warm, style=0, draw="points"),
        Line("recompute fit a*n + b*n^2", x, recompute, style=1, draw="curve"),
        Line("load fit c + n/r", x, load, style=0, draw="curve"),
    )
    be = fit.break_even_tokens
    marks = (Mark(be, f"break-even {be:,.0f} tokens", line="dotted"),) if be is not None and 0 < be < top else ()
    parameters = (
        ("a (recompute, s/token)", f"{fit.a:.4g}"),
        ("b (recompute, s/token^2)", f"{fit.b:.4g}"),
        ("c (load latency, s)", f"{fit.c:.4g}"),
        ("r (load rate, tokens/s)", fit.tokens_per_s),
        ("effective tier bandwidth (GB/s)", fit.bandwidth_gb_s),
        ("break-even prompt length (tokens)", be),
    )
    residuals = tuple(
        (r["phase"], int(r["tokens"]), r["measured_s"], r["fitted_s"], r["measured_s"] - r["fitted_s"])
        for r in fit.residuals
    )
    return [
        Heading("Cost model fit and break-even"),
        Paragraph(FIT_READ, "read"),
        Lines("Fitted cost models.", "prompt tokens", "TTFT (s)", lines, marks=marks),
        Table(("parameter", "value"), parameters),
        Table(
            ("phase", "tokens", "measured (s)", "fitted (s)", "residual (s)"),
            residuals,
            digits=4,
            folded=f"Residuals ({len(residuals)} requests)",
        ),
    ]


FIGURES = SweepFigures()
