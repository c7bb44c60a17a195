"""`kvbench compare BASE CANDIDATE`: each figure of two runs side by side, asv-compare style."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.analysis import stats
from harness.analysis.wording import num
from harness.config import kinds
from harness.core.errors import ExitCode, InputError
from harness.results import RunResult, Table, load_runs, skipped_warning

ALPHA = 0.05


@dataclass(frozen=True)
class Row:
    run: str
    figure: str
    base: float | None
    candidate: float | None
    ratio: float | None
    verdict: str


def _verdict(p: float | None, base: float, cand: float) -> str:
    if p is None:
        return "n/a (too few samples)"
    if p < ALPHA:
        return ("slower" if cand > base else "faster") + f" (significant, p={p:.2g})"
    return f"within noise (p={p:.2g})"


def _group_rows(label: str, base: RunResult, cand: RunResult) -> list[Row]:
    rows: list[Row] = []
    cand_groups = stats.groups(cand.records, ("phase", "target_tokens"))
    for (phase, length), b in stats.groups(base.records, ("phase", "target_tokens")).items():
        where = f"{phase}" + (f" @ {int(length):,}" if length is not None else "")
        c = cand_groups.get((phase, length), Table.of([]))
        for metric in ("ttft_s", "e2e_s"):
            x, y = stats.values(b, metric), stats.values(c, metric)
            if len(x) == 0 or len(y) == 0:
                continue
            p = stats.mann_whitney_p(x, y)
            for q in (50, 99):
                bv, cv = stats.aggregate(x, f"p{q}"), stats.aggregate(y, f"p{q}")
                rows.append(Row(label, f"{metric} p{q} {where}", bv, cv, cv / bv if bv else None, _verdict(p, bv, cv)))
    return rows


def compare(base: list[RunResult], cand: list[RunResult]) -> list[Row]:
    rows: list[Row] = []
    by_label = {r.label: r for r in cand}
    for b in base:
        c = by_label.get(b.label)
        if c is None:
            continue
        rows += _group_rows(b.label, b, c)
        if not kinds.get(b.kind).per_length:
            bv, cv = stats.throughput(b.records).req_per_s, stats.throughput(c.records).req_per_s
            ratio = cv / bv if bv and cv else None
            rows.append(Row(b.label, "req/s", bv, cv, ratio, "one value per run: repeat runs to judge noise"))
    return rows


def main(base: Path, candidate: Path) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from harness.monitor.progress import stderr_console

    runs = load_runs([base]), load_runs([candidate])
    if warning := skipped_warning([*runs[0], *runs[1]]):
        stderr_console().print(f"[yellow]warning:[/] {escape(warning)}")
    rows = compare(*runs)
    if not rows:
        raise InputError("nothing to compare: no run (scenario/arm) appears in both")
    table = Table(title=escape(f"{base} -> {candidate}"))
    for col in ("run", "figure", "base", "candidate", "ratio", "verdict"):
        table.add_column(col, justify="left" if col in ("run", "figure", "verdict") else "right")
    for r in rows:
        table.add_row(escape(r.run), escape(r.figure), num(r.base, 4), num(r.candidate, 4), num(r.ratio), r.verdict)
    Console().print(table)
    return ExitCode.OK
