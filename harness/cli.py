"""The `kvbench` command line: only wiring. Each command lives in its own module (harness/commands/,
and harness/gate/command.py); every user mistake ends in a one-line message and a documented exit
code (see harness/core/errors.py), never a traceback."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from harness import __version__
from harness.config.scenario import EmulatorCfg
from harness.core.errors import (
    EXIT_CODE_TABLE,
    ExitCode,
    KvbenchError,
    files_error,
    signals_ignored,
    signals_interrupt,
)
from harness.monitor.progress import stderr_console


def _handled(fn: Callable[..., int]) -> Callable[..., int]:
    """A user mistake ends in a one-line message and its exit code, never a traceback.
    (Usage errors are typer's own: message and exit 2.)"""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        signals_interrupt()  # a run's event loop sets its own while it runs
        try:
            code = fn(*args, **kwargs)
        except KvbenchError as e:
            stderr_console().print(f"[red]error:[/] {escape(str(e))}", highlight=False)
            raise typer.Exit(int(e.exit_code)) from None
        except (KeyboardInterrupt, asyncio.CancelledError):  # a run's task cancelled by Ctrl-C pressed again
            raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
        except OSError as e:  # a file kvbench writes or reads: full disk, size limit, permissions
            message = escape(str(files_error(e, "a file")))
            stderr_console().print(f"[red]error:[/] {message}", highlight=False)
            raise typer.Exit(int(ExitCode.FILES)) from None
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


WORKERS_HELP = (
    "Send from this many processes (one event loop each), results merged (default 1); with --ray, this many "
    "Ray workers (default: one per CPU of the cluster)."
)
RAY_HELP = (
    "Send from the workers of a Ray cluster on many client hosts: its address, or none for the cluster this "
    "host belongs to (needs pip install 'kvbench[ray]')."
)


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
    workers: Annotated[int | None, typer.Option(help=WORKERS_HELP, show_default=False)] = None,
    ray: Annotated[str | None, typer.Option("--ray", metavar="[ADDRESS]", help=RAY_HELP, show_default=False)] = None,
    timeout_connect: Annotated[float | None, typer.Option(help="Seconds to connect (overrides connect_s).")] = None,
    timeout_first_token: Annotated[
        float | None, typer.Option(help="Seconds from request start to first token (overrides first_token_s).")
    ] = None,
    timeout_idle: Annotated[
        float | None, typer.Option(help="Longest gap between two reads of a response (overrides idle_s).")
    ] = None,
    timeout_total: Annotated[
        float | None, typer.Option(help="Seconds to the end of a stream (overrides total_s).")
    ] = None,
    metrics_url: Annotated[
        list[str] | None,
        typer.Option(
            help="Prometheus endpoint to scrape around each phase (repeatable; default: the endpoint's /metrics)."
        ),
    ] = None,
) -> int:
    """Run a scenario against an endpoint, or the embedded emulator when none is given."""
    from harness.commands import run as command

    opts = command.RunOptions(
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
        ray=ray,
        report=report,
        timeouts=tuple(
            (k, v)
            for k, v in (
                ("connect_s", timeout_connect),
                ("first_token_s", timeout_first_token),
                ("idle_s", timeout_idle),
                ("total_s", timeout_total),
            )
            if v is not None
        ),
    )
    return command.main(opts, stderr_console())


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
    from harness.commands import report as command

    return command.main(results, output)


@app.command()
@_handled
def export(
    results: Annotated[
        list[Path],
        typer.Argument(
            help="Run folders, scenario result folders (all arms of the newest run) or a results root.",
            show_default=False,
        ),
    ],
    fmt: Annotated[str, typer.Option("--format", help="csv, parquet (kvbench[parquet]) or jsonl.")] = "csv",
    table: Annotated[
        str,
        typer.Option(
            help="requests (one row each), summary (one per arm and rate), by_length (sweeps), "
            "or configurations (a `kvbench size` result's, one row each)."
        ),
    ] = "requests",
    output: Annotated[Path | None, typer.Option("-o", "--output", help="File to write (default: stdout).")] = None,
) -> int:
    """Write a result's table as CSV, Parquet or JSON lines, for a spreadsheet or a notebook."""
    from harness.commands import export as command

    return command.main(results, fmt, table, output)


@app.command()
@_handled
def compare(
    base: Annotated[Path, typer.Argument(help="Baseline run or scenario result folder.", show_default=False)],
    candidate: Annotated[Path, typer.Argument(help="Candidate run or scenario result folder.", show_default=False)],
) -> int:
    """Compare two runs figure by figure: both values, the ratio, and whether the change is significant."""
    from harness.commands import compare as command

    return command.main(base, candidate)


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
    from harness.gate.command import run_gate

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
    from harness.gate.command import save_baseline

    return save_baseline(results, output)


trace_app = typer.Typer(help="Request traces (Mooncake, Qwen-Bailian).", no_args_is_help=True)
app.add_typer(trace_app, name="trace")


@trace_app.command("inspect")
@_handled
def trace_inspect(
    file: Annotated[Path, typer.Argument(help="Trace file (JSONL).", show_default=False)],
    fmt: Annotated[str, typer.Option("--format", help="auto, mooncake or bailian.")] = "auto",
    block_tokens: Annotated[
        int | None, typer.Option(help="Tokens per hash_ids block (default: 512 Mooncake, 16 Bailian).")
    ] = None,
    lru_blocks: Annotated[
        list[int] | None, typer.Option(help="Also the reuse of an LRU cache of this many blocks (repeatable).")
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Leave out bad lines (counted) instead of exit 2.")
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the figures as JSON.")] = None,
    max_context_tokens: Annotated[
        int | None,
        typer.Option(help="Refuse a line longer than this, with its output (default 1,048,576, as a scenario's)."),
    ] = None,
) -> int:
    """Requests, lengths, arrival rate, and the prompt tokens a prefix cache could serve."""
    from rich.console import Console

    from harness.commands import trace as command

    return command.main(
        file,
        fmt,
        block_tokens,
        lru_blocks or [],
        skip_bad,
        json_out,
        Console(highlight=False, soft_wrap=True),
        max_context_tokens,
    )


@trace_app.command("curve")
@_handled
def trace_curve(
    file: Annotated[Path, typer.Argument(help="Trace file (JSONL).", show_default=False)],
    sample: Annotated[
        float,
        typer.Option(help="Share of the blocks sampled (SHARDS; 1: all, exact): memory bounded by the sample."),
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="The sample's hash seed.")] = 0,
    kv_bytes_per_token: Annotated[
        float | None, typer.Option(help="The model's KV bytes per token: capacities in bytes too.")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto, mooncake or bailian.")] = "auto",
    block_tokens: Annotated[
        int | None, typer.Option(help="Tokens per hash_ids block (default: 512 Mooncake, 16 Bailian).")
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Leave out bad lines (counted) instead of exit 2.")
    ] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the curve as JSON.")] = None,
    max_context_tokens: Annotated[
        int | None,
        typer.Option(help="Refuse a line longer than this, with its output (default 1,048,576, as a scenario's)."),
    ] = None,
) -> int:
    """The share of prompt tokens an LRU prefix cache of every capacity would serve, in one pass
    over the file, sampled for traces too large to hold."""
    from rich.console import Console

    from harness.commands import trace as command

    return command.curve_main(
        file,
        fmt,
        block_tokens,
        sample,
        seed,
        kv_bytes_per_token,
        skip_bad,
        json_out,
        Console(highlight=False, soft_wrap=True),
        max_context_tokens,
    )


@app.command()
@_handled
def size(
    file: Annotated[Path, typer.Argument(help="Sizing file (SIZING.toml; docs/sizing.md).", show_default=False)],
    out: Annotated[Path, typer.Option(help="Where the result folder goes.")] = Path("results"),
    workers: Annotated[
        int, typer.Option(help="Processes that size a sweep's configurations side by side (one each at a time).")
    ] = 1,
    requests: Annotated[
        bool | None,
        typer.Option(
            "--requests/--no-requests",
            help="Write a row per request of each configuration (requests.csv.gz); "
            "default: unless there are more rows than docs/sizing.md's limit.",
            show_default=False,
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="Size the configurations on a Ray cluster's nodes (--workers of them at a time): its address, "
            "or alone for this host's cluster or RAY_ADDRESS's (pip install 'kvbench[ray]').",
            show_default=False,
        ),
    ] = None,
    dynamo: Annotated[
        bool,
        typer.Option(
            "--dynamo",
            help="Also replay each configuration Dynamo models (G1/G2 per worker, round-robin or its KV router) "
            "with Dynamo's offline replay, given the same requests and times (engines/dynamo/install.sh; exit 3 "
            "without it).",
        ),
    ] = False,
) -> int:
    """Size a fleet's KV tiers from a request trace, in simulation: the share of prompt tokens
    each tier serves, the read bandwidth each must sustain, TTFT and the SLO; lists in the file
    are a sweep of their every combination."""
    from harness.commands import size as command

    return command.main(file, out, stderr_console(), workers, requests, ray, dynamo)


@app.command()
@_handled
def validate(
    scenarios: Annotated[list[Path], typer.Argument(help="Scenario files to check.", show_default=False)],
) -> int:
    """Check scenario files without running them (exit 2 at the first bad one)."""
    from harness.commands import validate as command

    return command.main(scenarios)


@app.command()
@_handled
def emulator(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 8000,
    profile: Annotated[
        str, typer.Option(help="Emulator profile: redbooks-g4, tiered or recompute.")
    ] = EmulatorCfg.profile,
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
    capacity_blocks: Annotated[
        list[str] | None, typer.Option(help="A tier's capacity in KV blocks, TIER=BLOCKS (repeatable), e.g. G1=1000.")
    ] = None,
    embedded: Annotated[bool, typer.Option(hidden=True)] = False,
) -> int:
    """Serve the emulated KV-tiered endpoint for other tools (Ctrl-C to stop)."""
    from harness.commands import emulator as command

    opts = command.EmulatorOptions(
        host, port, profile, time_scale, api_key_env, timing_log, slowdown, embedded, tuple(capacity_blocks or ())
    )
    return command.main(opts)


def with_ray_value(argv: list[str]) -> list[str]:
    """`--ray` takes an optional address (typer's options take a value or none, not either): a
    bare one, followed by nothing, an option or the scenario file, means "auto"."""
    out = []
    for i, arg in enumerate(argv):
        out.append(arg)
        after = argv[i + 1] if i + 1 < len(argv) else None
        if arg == "--ray" and (after is None or after.startswith("-") or after.endswith(".toml")):
            out.append("auto")
    return out


def main() -> None:
    try:
        app(args=with_ray_value(sys.argv[1:]))
    finally:
        signals_ignored()  # the command is over: its exit code stands
