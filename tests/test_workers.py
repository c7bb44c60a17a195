"""`kvbench run --workers N`: a closed loop over several processes, merged into one result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from harness.config.scenario import DistributedCfg
from harness.distributed.worker import HEARTBEAT_S, deal
from harness.emulator.serve import EmbeddedEmulator
from harness.results import read_requests
from tests.conftest import (
    ROOT,
    interrupt,
    kvbench,
    parent_of,
    processes_with,
    result_lines,
    start_kvbench,
    write_scenario,
)

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
        assert meta["distributed"]["engine"] == "processes" and not meta["distributed"]["faults"]
        if folder.name.endswith("bust"):
            assert all(x.cached_tokens == 0 for x in recs)


def test_a_worker_slower_to_start_than_its_silence_limit_is_waited_for(tmp_path: Path) -> None:
    """Each worker process takes longer to start than the silence after which a running one is
    lost (as on a busy host: Python and kvbench's import): while its process lives it is waited
    for, however long, and the arm runs in full with no fault."""
    slow = DistributedCfg.lost_after_s + 2
    (tmp_path / "sitecustomize.py").write_text(
        f"import sys, time\nif '--multiprocessing-fork' in sys.argv:\n    time.sleep({slow})\n"
    )
    sc = write_scenario(tmp_path / "w.toml", LOOP.format(requests=12, tokens=2000, scale=20.0))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = kvbench("run", str(sc), "--arm", "reuse", "--workers", "2", "--out", str(tmp_path / "out"), env=env)
    assert r.returncode == 0, r.stderr
    (folder,) = (tmp_path / "out" / "w").iterdir()
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(12)) and all(x.ok for x in recs)
    assert not json.loads((folder / "run.json").read_text())["distributed"]["faults"]


def test_workers_need_a_closed_loop() -> None:
    r = kvbench("run", "scenarios/smoke.toml", "--workers", "2")
    assert r.returncode == 2 and "--workers" in r.stderr


@pytest.mark.slow
def test_ctrl_c_with_workers_keeps_merged_partial_results(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "w.toml", LOOP.format(requests=400, tokens=20000, scale=1.0))

    def four_done() -> bool:
        return result_lines(tmp_path / "out") >= 4

    code, err = interrupt(["run", str(sc), "--workers", "2", "--out", str(tmp_path / "out")], four_done)
    assert code == 130, err
    (folder,) = (tmp_path / "out" / "w").iterdir()
    assert json.loads((folder / "run.json").read_text())["status"] == "interrupted"
    recs = read_requests(folder)
    assert 4 <= len(recs) < 400 and [x.id for x in recs] == list(range(1, len(recs) + 1))


def answered(base_url: str) -> int:
    """How many requests an emulator answered to the end (its own counter)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        text = r.read().decode()
    (value,) = [line.split()[-1] for line in text.splitlines() if line.startswith("vllm:request_success_total")]
    return int(float(value))


def pause_past_the_bound(proc: subprocess.Popen[str], out: Path, requests: int, base_url: str) -> None:
    """kvbench (`proc`, sending `requests` into `out`) stopped mid-arm (SIGSTOP) for longer than
    the silence after which a worker is lost, then continued. Meanwhile, past the liveness bound
    and a heartbeat without a word from the coordinator, its workers send nothing new (the
    dead-man's switch): the server's count at `base_url` stands still."""
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        assert result_lines(out) < requests  # paused mid-arm
        time.sleep(DistributedCfg.lost_after_s + HEARTBEAT_S + 1)  # the pause, not a timing
        held = answered(base_url)
        time.sleep(2)
        assert answered(base_url) == held
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def _workers_of(pid: int) -> list[int]:
    """The worker processes (multiprocessing's spawn) a kvbench process started."""
    return [p for p in processes_with(b"spawn_main") if parent_of(p) == pid]


def _sending(tmp_path: Path, requests: int, emu: EmbeddedEmulator) -> tuple[subprocess.Popen[str], Path]:
    """A closed loop over two worker processes against `emu`, once six records are in and both
    processes are up."""
    sc = write_scenario(tmp_path / "w.toml", LOOP.format(requests=requests, tokens=2000, scale=1.0))
    out = tmp_path / "out"
    proc = start_kvbench(
        "run", str(sc), "--arm", "reuse", "--workers", "2", "--endpoint", emu.base_url, "--out", str(out)
    )
    deadline = time.monotonic() + 120
    while (result_lines(out) < 6 or len(_workers_of(proc.pid)) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc, out


@pytest.mark.slow
def test_sigterm_with_workers_stops_them_and_keeps_every_answered_request(tmp_path: Path) -> None:
    """SIGTERM to a run over two worker processes: exit 130, and every request the server
    answered (its own log of the X-Request-Ids it served to the end) is recorded once, as a
    success, under the id it was sent with."""
    log = tmp_path / "served.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        proc, out = _sending(tmp_path, 400, emu)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        served = answered(emu.base_url)
    assert proc.returncode == 130, err
    (folder,) = (out / "w").iterdir()
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "interrupted" and not meta["distributed"]["faults"]
    recs = read_requests(folder)
    assert 6 <= len(recs) < 400 and len({x.schedule_index for x in recs}) == len(recs)
    assert sum(x.ok for x in recs) == served  # every answer recorded, nothing recorded twice
    received = [json.loads(line)["request_id"] for line in log.read_text().splitlines()]
    sent = [x.request_id for x in recs if x.ok]
    assert len(set(sent)) == len(sent) and sorted(sent) == sorted(received) and len(received) == served


@pytest.mark.slow
def test_a_killed_worker_process_loses_only_what_it_held(tmp_path: Path) -> None:
    with EmbeddedEmulator("redbooks-g4", 5.0) as emu:
        proc, out = _sending(tmp_path, 150, emu)
        first, _ = _workers_of(proc.pid)
        os.kill(first, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        served = answered(emu.base_url)
    (folder,) = (out / "w").iterdir()
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(150))  # each once: sent or lost
    (fault,) = json.loads((folder / "run.json").read_text())["distributed"]["faults"]
    lost = [x for x in recs if not x.ok]
    assert all(x.error_kind == "lost" and x.process == fault["worker"] for x in lost)
    assert fault["lost_requests"] == len(lost) and f"worker process {fault['worker']}" in err
    assert proc.returncode == (4 if lost else 0), err
    # the server may have answered some that the killed process never recorded: never more
    assert sum(x.ok for x in recs) <= served


def test_records_larger_than_a_pipe_buffer_reach_the_coordinator(tmp_path: Path) -> None:
    """Long answers make long records (a gap per token): each record here is larger than a pipe's
    buffer (212,992 bytes on Linux), and must still arrive whole (a pipe made non-blocking by an
    event loop's reader failed such a message half sent, and the worker fell silent)."""
    # at least "0.0," a gap: 60,000 tokens make a record of 240,000 bytes or more however they came
    body = LOOP.format(requests=2, tokens=200, scale=200.0).replace("max_tokens = 8", "max_tokens = 60000")
    sc = write_scenario(tmp_path / "w.toml", body.replace("concurrency = 7", "concurrency = 2"))
    r = kvbench("run", str(sc), "--arm", "reuse", "--workers", "2", "--out", str(tmp_path / "out"), timeout=600)
    assert r.returncode == 0, r.stderr
    (folder,) = (tmp_path / "out" / "w").iterdir()
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == [0, 1] and all(x.ok for x in recs)
    assert all(len(x.itl_s) == 59999 for x in recs)
    assert all(len(x.to_json()) > 212_992 for x in recs)


@pytest.mark.slow
def test_a_paused_coordinator_blames_no_worker(tmp_path: Path) -> None:
    """kvbench stopped (SIGSTOP) for longer than the silence after which a worker is lost, then
    continued (a VM pause, swap, a laptop lid): its own pause is nobody's silence. No worker is
    declared lost, every request is recorded once and answered, and the run completes."""
    with EmbeddedEmulator("redbooks-g4", 5.0) as emu:
        proc, out = _sending(tmp_path, 150, emu)
        pause_past_the_bound(proc, out, 150, emu.base_url)
        _, err = proc.communicate(timeout=300)
        served = answered(emu.base_url)
    assert proc.returncode == 0, err
    (folder,) = (out / "w").iterdir()
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "completed" and not meta["distributed"]["faults"], err
    assert meta["distributed"]["accounting"] == {
        "scheduled": 150,
        "recorded": 150,
        "lost": 0,
        "unsent": 0,
        "balanced": True,
    }
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(150)) and all(x.ok for x in recs)
    assert len(recs) == served
