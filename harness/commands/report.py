"""`kvbench report RESULT...`: one self-contained HTML file from result folders."""

from __future__ import annotations

from pathlib import Path

from harness.core.errors import ExitCode


def main(results: list[Path], output: Path | None) -> int:
    from rich.markup import escape

    from harness.monitor.progress import stderr_console
    from harness.report.build import render
    from harness.results import load_runs, skipped_warning

    runs = load_runs(results)
    if warning := skipped_warning(runs):
        stderr_console().print(f"[yellow]warning:[/] {escape(warning)}")
    if output is None:
        names = sorted({str(r.meta.get("scenario_name", "run")) for r in runs})
        stamp = max(str(r.meta.get("run_id", "")) for r in runs)
        output = Path("reports") / f"{'+'.join(names)}-{stamp}.html"
    print(render(runs, output))
    return ExitCode.OK
