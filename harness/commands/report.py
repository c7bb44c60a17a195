"""`kvbench report RESULT...`: one self-contained HTML file from result folders (runs, or the
results of `kvbench size`)."""

from __future__ import annotations

from pathlib import Path

from harness.core.errors import ExitCode, InputError


def main(results: list[Path], output: Path | None) -> int:
    from rich.markup import escape

    from harness.monitor.progress import stderr_console
    from harness.report import sizing as sizing_report
    from harness.report.build import render
    from harness.results import load_runs, skipped_warning
    from harness.sizing import result as sizing

    sized = {p: sizing.folders(p) for p in results if p.exists()}
    if any(sized.values()):
        if not all(sized.get(p) for p in results):
            raise InputError(
                "give `kvbench report` sizing results or run results, not both: "
                + ", ".join(str(p) for p in results if not sized.get(p))
                + " holds no sizing.json"
            )
        read = [sizing.read(f) for p in results for f in sized[p]]
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
