"""`kvbench report RESULT...`: one self-contained HTML file from result folders (runs, or the
results of `kvbench size`)."""

from __future__ import annotations

from pathlib import Path

from harness.core.errors import ExitCode


def main(results: list[Path], output: Path | None) -> int:
    from rich.markup import escape

    from harness.monitor.progress import stderr_console
    from harness.report import sizing as sizing_report
    from harness.report.build import render
    from harness.results import load_runs, skipped_warning
    from harness.sizing import result as sizing

    if (sized := sizing.of(results, "kvbench report")) is not None:
        read = [sizing.read(f) for f in sized]
        if output is None:
            names = sorted({str(s.doc.get("name", "sizing")) for s in read})
            output = Path("reports") / f"{'+'.join(names)}-{read[-1].folder.name}.html"
        print(sizing_report.render(read, output))
        return ExitCode.OK
    runs = load_runs(results)
    if warning := skipped_warning(runs):
        stderr_console().print(f"[yellow]warning:[/] {escape(warning)}")
    if output is None:
        names = sorted({str(r.meta.get("scenario_name", "run")) for r in runs})
        stamp = max(str(r.meta.get("run_id", "")) for r in runs)
        output = Path("reports") / f"{'+'.join(names)}-{stamp}.html"
    print(render(runs, output))
    return ExitCode.OK
