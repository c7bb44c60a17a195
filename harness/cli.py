"""The `kvbench` command line. Every user mistake ends in a one-line message and a documented
exit code (see harness/errors.py), never a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from harness import __version__
from harness.errors import EXIT_CODE_TABLE, ExitCode, KvbenchError
from harness.progress import stderr_console


def _handled(fn: Callable[..., int]) -> Callable[..., int]:
    """A user mistake ends in a one-line message and its exit code, never a traceback.
    (Usage errors are typer's own: message and exit 2.)"""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            code = fn(*args, **kwargs)
        except KvbenchError as e:
            stderr_console().print(f"[red]error:[/] {e}", highlight=False)
            raise typer.Exit(int(e.exit_code)) from None
        except KeyboardInterrupt:
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        if code:
            raise typer.Exit(int(code))
        return 0

    return wrapper


app = typer.Typer(
    name="kvbench",
    help="Measure how much a shared KV-cache storage tier speeds up LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="\b\n" + EXIT_CODE_TABLE,
)

RUN_EXAMPLES = """\b
Examples:
  kvbench run scenarios/smoke.toml               # the embedded emulator: no server needed
  kvbench run scenarios/redbooks-ttft-sweep.toml --time-scale 20
  OPENAI_API_KEY=... kvbench run scenarios/redbooks-concurrency.toml \\
      --endpoint http://gpu1:8000/v1 --arm cached
"""


def _version(value: bool) -> None:
    if value:
        print(f"kvbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    pass


@app.command(epilog=RUN_EXAMPLES)
@_handled
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario file (TOML).", show_default=False)],
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="OpenAI base URL, e.g. http://host:8000/v1 (else $OPENAI_BASE_URL, else the "
            "scenario's endpoint.url, else the embedded emulator)."
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Model name (default: the first from GET /v1/models).")] = None,
    arm: Annotated[list[str] | None, typer.Option(help="Run only this arm (repeatable; default: all).")] = None,
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("results"),
    time_scale: Annotated[
        float | None,
        typer.Option(help="Emulator only: run X times faster; results are recorded in model time."),
    ] = None,
    header: Annotated[list[str] | None, typer.Option(help="Extra request header 'Name: value' (repeatable).")] = None,
    api_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the API key (default: OPENAI_API_KEY).")
    ] = None,
    report: Annotated[bool, typer.Option("--report", help="Render the HTML report right after the run.")] = False,
    workers: Annotated[
        int, typer.Option(help="Closed loops: send from this many processes (one event loop each), results merged.")
    ] = 1,
    metrics_url: Annotated[
        list[str] | None,
        typer.Option(
            help="Prometheus endpoint to scrape around each phase (repeatable; default: the endpoint's /metrics)."
        ),
    ] = None,
) -> int:
    """Run a scenario against an endpoint, or the embedded emulator when none is given."""
    from harness.runner import RunOptions
    from harness.runner import run as do_run

    opts = RunOptions(
        scenario=scenario,
        endpoint=endpoint,
        model=model,
        arms=tuple(arm or ()),
        out=out,
        time_scale=time_scale,
        headers=tuple(header or ()),
        api_key_env=api_key_env,
        metrics_urls=tuple(metrics_url or ()),
        workers=workers,
    )
    console = stderr_console()
    code, folders = do_run(opts, console)
    if report and folders:
        from harness.report.build import render
        from harness.report.load import load_runs

        runs = load_runs(folders)
        out = Path("reports") / f"{runs[0].meta['scenario_name']}-{runs[0].meta['run_id']}.html"
        console.print(f"Report: {render(runs, out)}")
    return code


@app.command()
@_handled
def report(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Run folders, or scenario result folders (all arms of the newest run).", show_default=False
        ),
    ],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="HTML file to write (default: reports/<name>.html).")
    ] = None,
) -> int:
    """Render one self-contained HTML report (no network, no JavaScript) from result folders."""
    from harness.report.build import render
    from harness.report.load import load_runs

    runs = load_runs(results)
    if output is None:
        names = sorted({str(r.meta.get("scenario_name", "run")) for r in runs})
        stamp = max(str(r.meta.get("run_id", "")) for r in runs)
        output = Path("reports") / f"{'+'.join(names)}-{stamp}.html"
    print(render(runs, output))
    return ExitCode.OK


@app.command()
@_handled
def compare(
    base: Annotated[Path, typer.Argument(help="Baseline run or scenario result folder.", show_default=False)],
    candidate: Annotated[Path, typer.Argument(help="Candidate run or scenario result folder.", show_default=False)],
) -> int:
    """Compare two runs figure by figure: both values, the ratio, and whether the change is significant."""
    from rich.table import Table

    from harness.compare import compare as do_compare
    from harness.errors import InputError
    from harness.report.build import _num
    from harness.report.load import load_runs

    rows = do_compare(load_runs([base]), load_runs([candidate]))
    if not rows:
        raise InputError("nothing to compare: no run (scenario/arm) appears in both")
    table = Table(title=f"{base} -> {candidate}")
    for col in ("run", "figure", "base", "candidate", "ratio", "verdict"):
        table.add_column(col, justify="left" if col in ("run", "figure", "verdict") else "right")
    for r in rows:
        table.add_row(r.run, r.figure, _num(r.base, 4), _num(r.candidate, 4), _num(r.ratio), r.verdict)
    from rich.console import Console

    Console().print(table)
    return ExitCode.OK


GATE_EXAMPLES = """\b
Examples:
  kvbench gate results/smoke --baseline baselines/smoke.json --junit gate.xml
  kvbench gate results/redbooks-concurrency --rules gate.toml --markdown gate.md --json gate.json
"""


@app.command(epilog=GATE_EXAMPLES)
@_handled
def gate(
    result: Annotated[
        Path, typer.Argument(help="Run folder, or a scenario's results folder (all arms).", show_default=False)
    ],
    baseline: Annotated[Path | None, typer.Option(help="Baseline JSON (kvbench baseline save).")] = None,
    rules: Annotated[Path | None, typer.Option(help="TOML file with a [gate] table; wins over the scenario's.")] = None,
    junit: Annotated[Path | None, typer.Option(help="Write JUnit XML: one testcase per rule.")] = None,
    markdown: Annotated[Path | None, typer.Option(help="Write the table as Markdown.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write machine-readable verdicts.")] = None,
) -> int:
    """Fail (exit 1) when TTFT or req/s break a threshold or regress beyond a limit, noise-aware."""
    from harness.gate_cmd import run_gate

    return run_gate(result, baseline, rules, junit, markdown, json_out, stderr_console())


baseline_app = typer.Typer(help="Baselines for `kvbench gate`.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.command("save")
@_handled
def baseline_save(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Run folders or scenario results folders; several runs "
            "of the same scenario record its run-to-run spread.",
            show_default=False,
        ),
    ],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Default: baselines/<scenario>.json.")] = None,
) -> int:
    """Save a compact baseline (samples and summaries per group, run-level figures per run)."""
    from harness import baseline as bl
    from harness.errors import InputError
    from harness.report.load import load_runs

    runs = load_runs(results)
    names = {r.meta.get("scenario_name") for r in runs}
    if len(names) != 1:
        raise InputError(f"a baseline holds one scenario; got {', '.join(sorted(map(str, names)))}")
    hashes = {r.meta.get("scenario_hash") for r in runs}
    if len(hashes) != 1:
        raise InputError("these runs ran different versions of the scenario (scenario_hash differs)")
    out = output or Path("baselines") / f"{names.pop()}.json"
    print(bl.save(runs, out))
    return ExitCode.OK


@app.command()
@_handled
def validate(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario files to check.", show_default=False)],
) -> int:
    """Check scenario files without running them (exit 2 at the first bad one)."""
    from harness.scenario import load

    for path in scenarios:
        sc = load(path)
        print(f"{path}: ok ({sc.workload.kind}, arms: {', '.join(a.name for a in sc.arms)}, hash {sc.digest()})")
    return ExitCode.OK


@app.command()
@_handled
def emulator(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8000,
    profile: Annotated[str, typer.Option(help="Emulator profile: redbooks-g4 or recompute.")] = "redbooks-g4",
    time_scale: Annotated[float, typer.Option(help="Run X times faster than the modelled hardware.")] = 1.0,
    api_key_env: Annotated[
        str | None, typer.Option(help="Require 'Authorization: Bearer <value of this variable>'.")
    ] = None,
    timing_log: Annotated[
        Path | None, typer.Option(help="Append each request's server-side times (monotonic ns) to this JSONL file.")
    ] = None,
    slowdown: Annotated[
        float, typer.Option(help="Stretch every modelled delay by this factor (e.g. to check that a gate fails).")
    ] = 1.0,
    embedded: Annotated[bool, typer.Option(hidden=True)] = False,
) -> int:
    """Serve the emulated KV-tiered endpoint for other tools (Ctrl-C to stop)."""
    import os

    from harness.emulator.profiles import profiles
    from harness.emulator.serve import serve
    from harness.errors import InputError

    if profile not in profiles():
        raise InputError(f"--profile: expected one of {', '.join(sorted(profiles()))}, got {profile!r}")
    if time_scale <= 0:
        raise InputError(f"--time-scale: expected a number > 0, got {time_scale}")
    if slowdown <= 0:
        raise InputError(f"--slowdown: expected a number > 0, got {slowdown}")
    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            raise InputError(f"--api-key-env: environment variable {api_key_env} is not set or empty")
    try:
        serve(host, port, profile, time_scale, key, timing_log, embedded, slowdown)
    except OSError as e:
        from harness.errors import EndpointError

        raise EndpointError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return ExitCode.OK


def main() -> None:
    app()
