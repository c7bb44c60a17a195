"""`kvbench run --workers N`: a closed loop over several processes, merged into one result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.distributed.workers import deal
from harness.results import read_requests
from tests.conftest import interrupt, kvbench, write_scenario

LOOP = """
name = "w"
[endpoint]
max_tokens = 8
[workload]
kind = "closed_loop"
requests = {requests}
concurrency = 7
pool = 10
prompt_tokens = {tokens}
[[arms]]
name = "bust"
cache = "bust"
[[arms]]
name = "reuse"
[emulator]
time_scale = {scale}
"""


def test_deal() -> None:
    assert deal(28, 3) == [10, 9, 9] and deal(2, 4) == [1, 1, 0, 0] and sum(deal(201, 4)) == 201


def test_two_processes_merge_into_one_result(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "w.toml", LOOP.format(requests=40, tokens=2000, scale=20.0))
    r = kvbench("run", str(sc), "--workers", "2", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    for folder in (tmp_path / "out" / "w").iterdir():
        recs = read_requests(folder)
        assert [x.id for x in recs] == list(range(1, 41))
        assert sorted(x.schedule_index for x in recs) == list(range(40))
        assert {x.process for x in recs} == {0, 1} and len({x.worker for x in recs}) == 7
        assert [x.start_s for x in recs] == sorted(x.start_s for x in recs)
        meta = json.loads((folder / "run.json").read_text())
        assert meta["status"] == "completed" and meta["client_health"]["processes"] == 2
        assert not list(folder.glob("requests.part-*"))
        if folder.name.endswith("bust"):
            assert all(x.cached_tokens == 0 for x in recs)


def test_workers_need_a_closed_loop() -> None:
    r = kvbench("run", "scenarios/smoke.toml", "--workers", "2")
    assert r.returncode == 2 and "--workers" in r.stderr


@pytest.mark.slow
def test_ctrl_c_with_workers_keeps_merged_partial_results(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "w.toml", LOOP.format(requests=400, tokens=20000, scale=1.0))

    def four_done() -> bool:
        parts = list(tmp_path.glob("out/w/*/requests.part-*.jsonl"))
        return sum(len(p.read_text().splitlines()) for p in parts) >= 4

    code, err = interrupt(["run", str(sc), "--workers", "2", "--out", str(tmp_path / "out")], four_done)
    assert code == 130, err
    (folder,) = (tmp_path / "out" / "w").iterdir()
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    recs = read_requests(folder)
    assert 4 <= len(recs) < 400 and [x.id for x in recs] == list(range(1, len(recs) + 1))
    assert not list(folder.glob("requests.part-*"))
