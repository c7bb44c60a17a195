"""`kvbench gate`: load the candidate, the rules and the baseline; judge; write every output."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.config.tables import read_toml
from harness.core.errors import ExitCode, InputError, write_file
from harness.gate import baselines, figures, output
from harness.gate.rules import Rules, merge, parse_rules
from harness.gate.verdicts import Verdict, evaluate
from harness.monitor.progress import stderr_console
from harness.results import load_runs, skipped_warning
from harness.sizing import result as sizing

STEP_SUMMARY_LIMIT = 1 << 20


def load_rules_file(path: Path) -> Rules:
    data = read_toml(path, "rules file")
    table = data.get("gate", data)
    if not isinstance(table, dict):
        raise InputError(f"{path}: expected a [gate] table")
    return parse_rules(table, str(path))


def run_gate(
    result: Path,
    baseline: Path | None,
    rules_file: Path | None,
    junit: Path | None,
    markdown: Path | None,
    json_out: Path | None,
    console: Console,
) -> int:
    sized = sizing.folders(result) if result.is_dir() else []
    if sized:
        name, verdicts, incomplete = _sizing_verdicts(result, sized, baseline, rules_file, console)
    else:
        name, verdicts, incomplete = _run_verdicts(result, baseline, rules_file, console)
    if any(v.verdict == "fail" for v in verdicts):
        code = ExitCode.GATE_FAILED
    elif any(v.verdict == "missing" for v in verdicts) or incomplete:
        code = ExitCode.MISSING_DATA
    else:
        code = ExitCode.OK

    title = f"kvbench gate: {name}" + (f" vs {baseline}" if baseline else "")
    table = Table(title=escape(title))
    for col in (*output.COLUMNS, "detail"):
        table.add_column(col, overflow="fold")
    colour = {"pass": "green", "fail": "bold red", "within noise": "yellow", "missing": "magenta"}
    for v in verdicts:
        c = output.cells(v)
        table.add_row(f"[{colour[v.verdict]}]{c[0]}[/]", *map(escape, [*c[1:], v.detail]))
    Console(width=max(160, Console().width)).print(table)
    failed = sum(v.verdict == "fail" for v in verdicts)
    missing = sum(v.verdict == "missing" for v in verdicts)
    console.print(
        f"{len(verdicts)} rules: {len(verdicts) - failed - missing} held, {failed} failed, {missing} missing data"
        f" -> exit {int(code)}"
    )

    md = output.markdown(verdicts, title)
    if markdown:
        write_file(markdown, md)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        _append_capped(Path(summary), md)
    if junit:
        write_file(junit, output.junit(verdicts, name))
    if json_out:
        meta = {
            "scenario": name,
            "result": str(result),
            "baseline": str(baseline) if baseline else None,
        }
        write_file(json_out, output.as_json(verdicts, meta, int(code)))
    return code


def _rules(table: Any, where: str, rules_file: Path | None) -> Rules:
    if table is not None and not isinstance(table, dict):
        raise InputError(f"{where}: gate: expected a table of rules, got {json.dumps(table)[:40]}")
    rules = parse_rules(table, where) if table else Rules()
    if rules_file is not None:
        rules = merge(rules, load_rules_file(rules_file))
    if not rules:
        raise InputError("no gate rules: add a [gate] table to the scenario or give --rules FILE")
    return rules


def _run_verdicts(
    result: Path, baseline: Path | None, rules_file: Path | None, console: Console
) -> tuple[str, list[Verdict], list[str]]:
    """A run's result judged: its name, the verdicts, and what is incomplete of it."""
    meta = load_runs([result], records=False)[0].meta  # the rules first: no records read for nothing
    scenario = meta.get("scenario", {})
    rules = _rules(scenario.get("gate"), str(meta.get("scenario_file", result)), rules_file)
    # a token's gaps are most of a record's memory: read only when a rule judges them
    runs = load_runs([result], itl="itl_s" in rules.metrics)
    cand_identity = baselines.identity(runs)
    base_fig = None
    if baseline is not None:
        doc, base_fig = baselines.load(baseline)
        baselines.check_compatible(doc["identity"], cand_identity)
    cand_fig = figures.of_runs(runs, rules.metrics)
    verdicts = evaluate(rules, cand_fig, base_fig)
    for note in cand_fig.notes:
        console.print(f"note: {escape(note)}")
    incomplete = [r.label for r in runs if r.meta.get("status") != "completed"]
    if incomplete:
        console.print(f"[yellow]warning:[/] not completed: {escape(', '.join(incomplete))}; judging partial results")
    if skipped := skipped_warning(runs):
        incomplete.append("skipped lines")  # damaged data is missing data: never a silent pass
        console.print(f"[yellow]warning:[/] {escape(skipped)}")
    return str(cand_identity["scenario_name"]), verdicts, incomplete


def _sizing_verdicts(
    result: Path, folders: list[Path], baseline: Path | None, rules_file: Path | None, console: Console
) -> tuple[str, list[Verdict], list[str]]:
    """A sizing result judged by thresholds on each configuration's simulated figures (sizing.result
    METRICS; a configuration is a rule's `arm`)."""
    if len(folders) > 1:
        raise InputError(f"{result}: holds {len(folders)} sizings; give one's folder")
    if baseline is not None:
        raise InputError("--baseline: a sizing result is gated by thresholds on its figures, not against a baseline")
    s = sizing.read(folders[0])
    rules = _rules(s.doc.get("gate"), str(s.doc.get("file", folders[0])), rules_file)
    if rules.regressions:
        raise InputError(f"{folders[0]}: regression rules need runs and a baseline; a sizing takes thresholds only")
    verdicts = evaluate(rules, figures.of_sizing(s), None)
    incomplete = []
    if s.doc.get("status") != "completed":
        incomplete.append(f"{s.doc.get('status')} sizing")
        console.print(f"[yellow]warning:[/] the sizing was {escape(str(s.doc.get('status')))}: judging what it sized")
    return str(s.doc.get("name", "sizing")), verdicts, incomplete


def _append_capped(path: Path, text: str) -> None:
    """GitHub refuses step summaries over 1 MiB."""
    used = path.stat().st_size if path.exists() else 0
    room = STEP_SUMMARY_LIMIT - used - 200
    if room <= 0:
        return
    data = text.encode()
    if len(data) > room:
        data = data[:room].rsplit(b"\n", 1)[0] + b"\n\n(table cut to keep the step summary under 1 MiB)\n"
    with path.open("ab") as f:
        f.write(data)


def save_baseline(results: list[Path], output: Path | None) -> int:
    """`kvbench baseline save`: one scenario's runs into a baseline file."""
    runs = load_runs(results)
    if skipped := skipped_warning(runs):
        stderr_console().print(f"[yellow]warning:[/] {escape(skipped)}")
    names = {r.meta.get("scenario_name") for r in runs}
    if len(names) != 1:
        raise InputError(f"a baseline holds one scenario; got {', '.join(sorted(map(str, names)))}")
    hashes = {r.meta.get("scenario_hash") for r in runs}
    if len(hashes) != 1:
        raise InputError("these runs ran different versions of the scenario (scenario_hash differs)")
    out = output or Path("baselines") / f"{names.pop()}.json"
    print(baselines.save(runs, out))
    return ExitCode.OK
