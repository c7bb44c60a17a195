"""One number per figure: result folders recorded before the layout change give the figures that
the code of that time computed (tests/golden/runs/expected-figures.json), and every consumer of
a result (progress, run.json's summary, the report, the gate, `compare`, `baseline`) gives the
same completed count, req/s and TTFT percentiles for the same run."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.analysis import findings, stats
from harness.analysis.kinds import figures_of
from harness.commands import compare
from harness.gate import baselines, figures
from harness.gate.rules import parse_rules
from harness.gate.verdicts import evaluate
from harness.monitor.progress import RunProgress
from harness.report.build import build_context
from harness.results import RunResult, load_runs
from harness.server import checks
from tests.conftest import kind_table, kvbench, write_scenario

GOLDEN = Path(__file__).parent / "golden" / "runs"
EXPECTED = json.loads((GOLDEN / "expected-figures.json").read_text())
REL = 1e-9  # the old code summed in Python where the core uses numpy: last-bit differences only


def same(got: Any, want: Any, where: str = "") -> None:
    """Equal up to REL for numbers, exactly for everything else; None stands for NaN."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        for k, v in want.items():
            same(got.get(k), v, f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list | tuple) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        assert got is not None and math.isclose(got, want, rel_tol=REL, abs_tol=1e-12), f"{where}: {got} != {want}"
    elif want is None and isinstance(got, float):
        assert math.isnan(got), f"{where}: {got} != None"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def renamed(d: dict[str, Any], **names: str) -> dict[str, Any]:
    """The old code's names for the same figures (one naming now: run.json's)."""
    return {names.get(k, k): v for k, v in d.items()}


def no_intervals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bootstrap intervals are resampled (now by scipy): compared for coverage, not equality."""
    return [{k: v for k, v in r.items() if "_ci_" not in k} for r in rows]


@pytest.mark.parametrize("name", ["smoke", "golden-loop"])
def test_recorded_results_give_the_same_figures(name: str) -> None:
    runs = load_runs([GOLDEN / name])
    want = EXPECTED[name]
    ctx = build_context(runs)
    for run in runs:
        w = want["runs"][run.arm]
        summary = figures_of(run.kind).summary(run.records)
        same(summary, w["summary"], f"{run.label} summary")
        same(summary, run.meta["summary"], f"{run.label} run.json")
        same(no_intervals(findings.group_stats(run.records)), w["group_stats"], f"{run.label} groups")
        cache = findings.cache_verification(run.records, checks.allowance_of(run.meta))
        same(cache, {k: v for k, v in w["cache_verification"].items() if k != "label"}, f"{run.label} cache")
        if run.kind == "sweep":
            rows = stats.sweep_rows(run.records, intervals=True)
            old = [renamed(r, cold_p50_s="cold_ttft_p50_s", warm_p50_s="warm_ttft_p50_s") for r in w["speedup_table"]]
            same(no_intervals(rows), old, f"{run.label} speedup")
            for r in rows:
                if r["speedup_ci_lo"] is not None:
                    assert r["speedup_ci_lo"] <= r["speedup"] <= r["speedup_ci_hi"]
            fit = findings.fit_cost_model(run.records, 73728)
            same(None if fit is None else {k: getattr(fit, k) for k in w["fit"]}, w["fit"], f"{run.label} fit")
        else:
            t = stats.throughput(run.records)
            old = renamed(w["closed_loop"], output_tok_per_s="output_tokens_per_s")
            same({k: getattr(t, k) for k in old}, old, f"{run.label} throughput")
    same(ctx["cards"], want["cards"], "cards")
    same([{"name": c.name, "measured": c.measured} for c in ctx["claims"]], want["claims_measured"], "claims")
    run_values = {f"{a}|{m}|{n}": v for (a, m, n, rate), v in figures.of_runs(runs).run_values.items()}
    same(run_values, want["gate_run_values"], "gate")


def _figures_everywhere(run: RunResult, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """completed, req/s and TTFT p50/p90/p99 of one arm as each consumer computes them."""
    quantiles = ("p50", "p90", "p99")
    with open(os.devnull, "w") as quiet:
        progress = RunProgress(Console(file=quiet))
        progress.start(run.arm, len(run.records))
        for r in run.records:
            progress.advance(r.ok, r.ttft_s)
    s = figures_of(run.kind).summary(run.records)
    out: dict[str, dict[str, Any]] = {
        "progress": {"completed": progress.done - progress.errors, "p50": progress.p50},
        "run.json": {
            "completed": s["completed"],
            "req_per_s": s["req_per_s"],
            **{q: s["ttft_s"][q] for q in quantiles},
        },
    }
    (loop,) = kind_table([run], "Throughput (closed loop)").values()
    out["report"] = {"completed": loop["completed"], "req_per_s": loop["req/s"]}
    out["report"].update({q: loop[f"TTFT {q} (s)"] for q in quantiles})
    rules = parse_rules(
        {"thresholds": {"ttft_s": [f"{q} > 0" for q in ("count", *quantiles)], "req_per_s": ["value > 0"]}}, "t"
    )
    got = {(v.metric, v.rule.split()[0]): v.candidate for v in evaluate(rules, figures.of_runs([run]), None)}
    out["gate"] = {"completed": got[("ttft_s", "count")], "req_per_s": got[("req_per_s", "value")]}
    out["gate"].update({q: got[("ttft_s", q)] for q in quantiles})
    rows = {r.figure: r for r in compare.compare([run], [run])}
    out["compare"] = {"req_per_s": rows["req/s"].base}
    out["compare"].update({q: rows[f"ttft_s {q} run @ 2,000"].base for q in ("p50", "p99")})
    doc = json.loads(baselines.save([run], tmp_path / "b.json").read_text())
    (group,) = doc["groups"]
    (rate,) = [v["values"][0] for v in doc["run_values"] if v["metric"] == "req_per_s"]
    out["baseline"] = {"completed": group["ttft_s"]["count"], "req_per_s": rate}
    out["baseline"].update({q: group["ttft_s"][q] for q in ("p50", "p99")})
    return out


def test_every_consumer_gives_the_same_figures(tmp_path: Path) -> None:
    sc = write_scenario(
        tmp_path / "one.toml",
        'name = "one"\n[endpoint]\nmax_tokens = 4\n[workload]\nkind = "closed_loop"\nrequests = 60\n'
        "concurrency = 6\npool = 6\nprompt_tokens = 2000\n[emulator]\ntime_scale = 50.0\n",
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (run,) = load_runs([tmp_path / "out" / "one"])
    seen = _figures_everywhere(run, tmp_path)
    truth = seen["run.json"]
    assert truth["completed"] == 60 and truth["req_per_s"] > 0
    for consumer, values in seen.items():
        for key, value in values.items():
            assert value == truth[key], f"{consumer} {key}: {value} != run.json's {truth[key]}"
