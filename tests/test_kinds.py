"""Workload kinds as plugins: a kind from one file outside kvbench (tests/toy_kind.py), found
through the `kvbench.workloads` entry point group as a plugin package's would be, validated,
run end to end against the embedded emulator, reported and gated, with no other file changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import arm_folders, kvbench, write_scenario

TOY = """
name = "toy"
[endpoint]
max_tokens = 4
[workload]
kind = "bursts"
bursts = 3
size = 4
prompt_tokens = 1500
gap_s = 0.5
[[arms]]
name = "recompute"
cache = "bust"
[[arms]]
name = "cached"
[emulator]
time_scale = 10.0
[gate.thresholds]
burst_ttft_spread = ["value < 1000"]
ttft_s = ["p99 < 1000"]
"""


def plugin_path(tmp: Path) -> str:
    """A folder holding what `pip install` of a plugin package leaves: its metadata, naming the
    kind's entry point (the module itself is found from the checkout, as tests/ is)."""
    info = tmp / "site" / "kvbench_toy-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvbench-toy\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[kvbench.workloads]\nbursts = tests.toy_kind:SPEC\n", encoding="utf-8")
    return str(tmp / "site")


@pytest.mark.slow
def test_a_kind_from_one_file_runs_reports_and_gates_end_to_end(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "toy.toml", TOY)
    without = kvbench("validate", str(sc))
    assert without.returncode == 2 and "workload.kind" in without.stderr and '"bursts"' in without.stderr

    env = {"PYTHONPATH": plugin_path(tmp_path)}
    ok = kvbench("validate", str(sc), env=env)
    assert ok.returncode == 0, ok.stderr
    assert "(bursts, arms: recompute, cached" in ok.stdout
    typo = write_scenario(tmp_path / "typo.toml", TOY.replace("size = 4", "sise = 4"))
    bad = kvbench("validate", str(typo), env=env)
    assert bad.returncode == 2 and "workload.sise: unknown key (did you mean 'size'?)" in bad.stderr

    run = kvbench("run", str(sc), "--out", str(tmp_path / "out"), env=env)
    assert run.returncode == 0, run.stderr
    assert "3 bursts, TTFT spread within a burst" in run.stderr
    folders = arm_folders(tmp_path / "out", "toy")
    for arm in ("recompute", "cached"):
        meta = json.loads((folders[arm] / "run.json").read_text())
        assert meta["status"] == "completed" and meta["scenario"]["workload"]["kind"] == "bursts"
        s = meta["summary"]
        assert (s["requests"], s["completed"], s["bursts"]) == (12, 12, 3)
        assert s["burst_ttft_spread_s"] is not None and s["req_per_s"] > 0
        lines = (folders[arm] / "requests.jsonl").read_text().splitlines()
        assert sorted(json.loads(x)["schedule_index"] for x in lines) == list(range(12))

    html = tmp_path / "toy.html"
    rep = kvbench("report", str(tmp_path / "out" / "toy"), "--output", str(html), env=env)
    assert rep.returncode == 0, rep.stderr
    page = html.read_text()
    assert "Bursts: one prompt wanted by many at once" in page and "toy/cached" in page

    gate = kvbench("gate", str(tmp_path / "out" / "toy"), "--json", str(tmp_path / "gate.json"), env=env)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    verdicts = json.loads((tmp_path / "gate.json").read_text())
    spread = [v for v in verdicts["verdicts"] if v["metric"] == "burst_ttft_spread"]
    assert len(spread) == 2 and all(v["verdict"] == "pass" and v["candidate"] > 0 for v in spread), spread
    strict = tmp_path / "strict.toml"
    strict.write_text('[gate.thresholds]\nburst_ttft_spread = ["value < 0"]\n', encoding="utf-8")
    failed = kvbench("gate", str(tmp_path / "out" / "toy"), "--rules", str(strict), env=env)
    assert failed.returncode == 1, failed.stdout + failed.stderr
