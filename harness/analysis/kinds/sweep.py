"""`kind = "sweep"`'s figures: TTFT per prompt length, cold against warm, and the speed-up per
length for the gate."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table as RichTable

from harness.analysis import stats, wording
from harness.analysis.kinds import Figures, GateFigures
from harness.results import RunResult

LATE_MARK = "!"  # beside a row the emulator ran late in


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


FIGURES = SweepFigures()
