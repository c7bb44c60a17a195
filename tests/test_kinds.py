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
    (info / "entry_points.txt").write_text(
        "[kvbench.workloads]\nbursts = tests.toy_kind:SPEC\nladder = tests.toy_ladder:SPEC\n", encoding="utf-8"
    )
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


LADDER = """
name = "ladder"
[endpoint]
max_tokens = 4
[workload]
kind = "ladder"
rungs = [1000, 2000, 3000]
repeats = 2
[[arms]]
name = "cached"
[emulator]
time_scale = 10.0
"""


@pytest.mark.slow
def test_a_kind_with_its_own_record_fields_and_report_section_needs_no_other_file(tmp_path: Path) -> None:
    """tests/toy_ladder.py: its records carry its own fields (rung, rung_tokens, repeat) under
    `kind_fields`, apart from every kind's; its report section reads them back typed; an export
    gives them as `ladder.<field>` columns, empty for a run of another kind beside it."""
    env = {"PYTHONPATH": plugin_path(tmp_path)}
    sc = write_scenario(tmp_path / "ladder.toml", LADDER)
    run = kvbench("run", str(sc), "--out", str(tmp_path / "out"), env=env)
    assert run.returncode == 0, run.stderr
    assert "3 rungs" in run.stderr
    folder = arm_folders(tmp_path / "out", "ladder")["cached"]
    lines = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    assert sorted((x["kind_fields"]["rung"], x["kind_fields"]["repeat"]) for x in lines) == [
        (k, r) for k in range(3) for r in range(2)
    ]
    assert all(x["kind_fields"]["rung_tokens"] == x["target_tokens"] for x in lines)
    assert not {"rung", "repeat_of", "rung_tokens"} & set(lines[0])  # nothing of the kind's at the top level

    html = tmp_path / "ladder.html"
    rep = kvbench("report", str(tmp_path / "out" / "ladder"), "--output", str(html), env=env)
    assert rep.returncode == 0, rep.stderr
    page = html.read_text()
    assert (
        "Ladder: TTFT by rung" in page and "<td>2</td><td>3,000</td><td>2</td>" in page
    )  # rung 2: 3,000 tokens, 2 requests
    # its further parts, in order: a heading, a paragraph, a plot drawn, a folded table with a
    # flagged cell wherever a repeat was not the faster
    order = [
        page.index(x)
        for x in (
            "<h3>Repeats against first sends</h3>",
            "should be the faster",
            "Median TTFT by rung.</figcaption>",
            "<summary>Faster on a repeat, by rung</summary>",
        )
    ]
    assert order == sorted(order)
    assert page.count("<td>yes</td>") + page.count('<span class="flag">no</span>') == 3

    # beside a run of another kind (the bursts toy's): its ladder columns are empty
    bursts = write_scenario(tmp_path / "toy.toml", TOY.replace("bursts = 3", "bursts = 1"))
    assert kvbench("run", str(bursts), "--out", str(tmp_path / "out"), env=env).returncode == 0
    csv = tmp_path / "requests.csv"
    both = [str(tmp_path / "out" / "ladder"), str(tmp_path / "out" / "toy")]
    exp = kvbench("export", *both, "--format", "csv", "-o", str(csv), env=env)
    assert exp.returncode == 0, exp.stderr
    import pandas as pd

    frame = pd.read_csv(csv)
    ladder, other = frame[frame["kind"] == "ladder"], frame[frame["kind"] == "bursts"]
    assert sorted(ladder["ladder.rung_tokens"].tolist()) == [1000, 1000, 2000, 2000, 3000, 3000]
    assert len(other) == 8 and other["ladder.rung"].isna().all()
    assert "kind_fields" not in frame


def test_a_records_kind_fields_are_read_strictly_and_back_typed() -> None:
    """`kind_fields` holds scalars only, at most KIND_FIELDS_MAX of them (a line with more, or a
    nested value, is not a record); a kind reads them back typed, and gets None for fields that
    do not fit its record (another kind's, or a bool where it declares an int)."""
    from harness.results import KIND_FIELDS_MAX, RequestRecord
    from tests.toy_ladder import LadderRecord

    line = {
        "id": 1, "arm": "a", "phase": "run", "prompt_id": "p", "start_s": 0.0, "ok": True,
        "target_tokens": None, "prompt_tokens": None, "cached_tokens": None, "completion_tokens": None,
        "ttft_s": None, "first_byte_s": None, "first_content_s": None, "headers_s": None, "e2e_s": None,
        "error": None, "error_kind": None, "http_status": None,
    }  # fmt: skip
    r = RequestRecord.from_json({**line, "kind_fields": {"rung": 2, "rung_tokens": 3000, "repeat": 0}})
    assert LadderRecord.of(r) == LadderRecord(2, 3000, 0)
    assert json.loads(r.to_json())["kind_fields"] == {"rung": 2, "rung_tokens": 3000, "repeat": 0}
    assert "kind_fields" not in json.loads(RequestRecord.from_json(line).to_json())
    assert LadderRecord.of(RequestRecord.from_json(line)) is None
    for other in ({"rung": True, "rung_tokens": 3000, "repeat": 0}, {"rung": 2, "repeat": 0}, {"session": 4}):
        assert LadderRecord.of(RequestRecord.from_json({**line, "kind_fields": other})) is None
    for bad in ({"rung": {"nested": 1}}, {"rung": [1]}, {f"k{i}": i for i in range(KIND_FIELDS_MAX + 1)}, [1]):
        with pytest.raises(ValueError, match="kind_fields: expected an object"):
            RequestRecord.from_json({**line, "kind_fields": bad})
