"""Random scenario files, gate rules and result folders fed to validate, gate, report, compare
and baseline: never a traceback, only documented exit codes (issue 12). In process, through the
CLI's own entry point, so that hundreds of examples take seconds. Derandomized, so that CI is
repeatable (turn it off locally to explore further)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from harness.cli import app
from harness.core.errors import ExitCode

GOLDEN = Path(__file__).parent / "golden" / "runs"
DOCUMENTED = {int(c) for c in ExitCode}
KEYS = [
    "schema_version", "name", "workload", "kind", "lengths", "requests", "concurrency", "pool", "prompt_tokens",
    "endpoint", "max_tokens", "temperature", "timeouts", "idle_s", "extra_body", "arms", "cache", "traffic",
    "tool", "target", "directory", "gate", "thresholds", "regression", "metrics", "emulator", "time_scale",
    "distribution", "min", "max", "max_line_bytes", "reference", "test",
]  # fmt: skip

scalars = st.one_of(
    st.integers(-5, 10**7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=20),
    st.sampled_from(["sweep", "closed_loop", "fio", "reuse", "bust", "[/x]", "p50 < 1", "+10%", "200GB/s", "/"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
tables = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml(d: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in d.items())


def cli(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code in DOCUMENTED, (args, result.output)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)


# Examples per fuzzer: 60 keeps the suite short; KVBENCH_FUZZ_EXAMPLES=3000 (say) explores further
EXAMPLES = int(os.environ.get("KVBENCH_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.one_of(tables.map(toml), st.text(max_size=200)), st.booleans())
def test_random_scenario_files(text: str, valid_header: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.toml"
        header = 'schema_version = 1\nname = "f"\n' if valid_header else ""
        path.write_text(header + text, encoding="utf-8")
        cli("validate", str(path))


@FUZZ
@given(tables.map(lambda d: "[gate]\n" + toml(d)), st.sampled_from(["smoke", "golden-loop"]))
def test_random_gate_rules(text: str, scenario: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.toml"
        rules.write_text(text, encoding="utf-8")
        cli("gate", str(GOLDEN / scenario), "--rules", str(rules), "--json", str(Path(tmp) / "g.json"))


@pytest.mark.slow
@settings(max_examples=EXAMPLES * 2 // 3, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(["schema_version", "scenario", "arm", "status", "summary", "run_id"]), values),
    st.lists(st.one_of(values.map(json.dumps), st.text(max_size=30)), max_size=5),
    st.dictionaries(
        st.sampled_from(
            ["ttft_s", "e2e_s", "ok", "phase", "target_tokens", "start_s", "itl_s", "emulator_late_s", "intended_s"]
        ),
        values,
    ),
    st.sampled_from(["smoke", "golden-loop"]),
    st.one_of(st.none(), st.binary(max_size=60)),
    st.one_of(st.none(), st.lists(st.one_of(values.map(json.dumps), st.text(max_size=30)), max_size=4)),
)
def test_random_result_folders(
    meta: dict[str, Any],
    extra_lines: list[str],
    record: dict[str, Any],
    scenario: str,
    metrics: bytes | None,
    traffic: list[str] | None,
) -> None:
    """A kvbench result folder with random keys in run.json, random lines and fields in its
    records (a sweep's or a closed loop's), and a damaged metrics.json or traffic.jsonl: every
    reader ends in a documented exit code, never a traceback."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "r"
        shutil.copytree(next((GOLDEN / scenario).iterdir()), folder)
        recorded = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**recorded, **meta}))
        lines = (folder / "requests.jsonl").read_text().splitlines()
        lines[0] = json.dumps({**json.loads(lines[0]), **record})
        (folder / "requests.jsonl").write_text("\n".join(lines + extra_lines) + "\n")
        if metrics is not None:
            (folder / "metrics.json").write_bytes(metrics)
        if traffic is not None:
            (folder / "traffic.json").write_text('{"tool": "fio"}')
            (folder / "traffic.jsonl").write_text("\n".join(traffic) + "\n")
        cli("report", str(folder), "-o", str(Path(tmp) / "r.html"))
        cli("compare", str(folder), str(folder))
        cli("baseline", "save", str(folder), "-o", str(Path(tmp) / "b.json"))
        cli("gate", str(folder), "--baseline", str(Path(tmp) / "b.json"))
        cli("export", str(folder), "-o", str(Path(tmp) / "e.csv"))


odd = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["-1", "0", "1e308", "nan", "inf", "99999", "\u00b2", "http://[::1/v1", "http://127.0.0.1:99999/v1"]
    ),
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
RUN_OPTIONS = ["--time-scale", "--timeout-connect", "--timeout-first-token", "--timeout-idle", "--timeout-total"]


@FUZZ
@given(
    st.lists(
        st.tuples(st.sampled_from([*RUN_OPTIONS, "--header", "--workers", "--arm", "--endpoint"]), odd), max_size=4
    )
)
def test_random_cli_values_for_run(options: list[tuple[str, str]]) -> None:
    """Odd values for run's options: a documented exit code, never a traceback. Whatever is
    valid goes to a closed port of this machine (127.0.0.1:9), so nothing runs or leaves it."""
    args = ["run", "scenarios/smoke.toml", "--endpoint", "http://127.0.0.1:9/v1"]
    for flag, value in options:
        if flag == "--endpoint" and not value.startswith("http://[::1") and "99999" not in value:
            continue  # only the malformed ones: a valid URL could name another host
        args += [flag, value]
    with tempfile.TemporaryDirectory() as tmp:
        cli(*args, "--out", tmp)


@FUZZ
@given(st.sampled_from(["csv", "jsonl", "parquet", "xlsx", ""]), st.sampled_from(["requests", "summary", "x"]), odd)
def test_random_cli_values_for_export_and_trace(fmt: str, table: str, value: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cli("export", str(GOLDEN / "smoke"), "--format", fmt, "--table", table, "-o", str(Path(tmp) / "x"))
        cli("trace", "inspect", "scenarios/traces/mooncake-sample.jsonl", "--block-tokens", value)
        cli("trace", "inspect", "scenarios/traces/mooncake-sample.jsonl", "--lru-blocks", value)


SIZING_KEYS = ["kind", "status", "swept", "configurations", "name", "tenants", "cluster", "engine", "trace", "gate"]
FIGURE_KEYS = ["tiers", "ttft_s", "recompute_ttft_s", "slo", "prefill_gpu_s", "recompute_prefill_gpu_s", "requests"]


@FUZZ
@given(
    st.dictionaries(st.sampled_from(SIZING_KEYS), values, max_size=3),
    st.dictionaries(st.sampled_from(["swept", "workers", "tiers", "figures"]), values, max_size=2),
    st.dictionaries(st.sampled_from(FIGURE_KEYS), values, max_size=3),
    st.dictionaries(st.sampled_from(["name", "share", "read_bytes_per_s", "curve", "capacity_blocks"]), values),
)
def test_random_sizing_results(
    top: dict[str, Any], configuration: dict[str, Any], figures: dict[str, Any], tier: dict[str, Any]
) -> None:
    """A `kvbench size` result (tests/golden/sizing) with random values at its top, in a
    configuration, its figures and a tier's: the report, the gate and the export of it end in a
    documented exit code, never a traceback."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "s"
        shutil.copytree(next((GOLDEN.parent / "sizing" / "hand").iterdir()), folder)
        doc = json.loads((folder / "sizing.json").read_text())
        c = doc["configurations"][0]
        c["figures"]["tiers"][0].update(tier)
        c["figures"].update(figures)
        c.update(configuration)
        doc.update(top)
        (folder / "sizing.json").write_text(json.dumps(doc))
        cli("report", str(folder), "-o", str(Path(tmp) / "r.html"))
        cli("gate", str(folder))
        cli("export", str(folder), "--table", "configurations", "-o", str(Path(tmp) / "c.csv"))
