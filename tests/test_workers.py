"""`kvbench run --workers N`: a closed loop over several processes, merged into one result."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from harness.config.scenario import DistributedCfg
from harness.distributed.worker import HEARTBEAT_S, ID_STRIDE, deal
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


def received(log: Path) -> list[tuple[str, int]]:
    """The emulator's log of every request it received (its timing log, a line as each ended,
    answered or not): each one's X-Request-Id and when it came (ns, the machine's monotonic
    clock, which time.perf_counter_ns reads too)."""
    return [(x["request_id"], x["recv_ns"]) for x in map(json.loads, log.read_text().splitlines())]


def sender_of(request_id: str) -> int:
    """The worker that sent a request, from its X-Request-Id (worker k numbers its requests from
    k x ID_STRIDE)."""
    return int(request_id.rsplit("-", 1)[1]) // ID_STRIDE


def accounted(folder: Path, log: Path, lost_by_ns: int | None = None) -> dict[int, int]:
    """Nothing the server received is unaccounted for: each request in its log (`log`) is a
    record's `request_id` once, or was sent by a worker run.json names lost, and then no more of
    those than the requests that worker's fault says it held; with `lost_by_ns` (a time by which
    those workers had been declared lost), none of theirs came after it. Returns each lost
    worker's requests the server received and nobody recorded."""
    recorded = [x.request_id for x in read_requests(folder) if x.request_id is not None]
    assert len(set(recorded)) == len(recorded)  # none recorded twice
    meta = json.loads((folder / "run.json").read_text())
    faults = {f["worker"]: f["lost_requests"] for f in meta["distributed"]["faults"]}
    got = received(log)
    assert len({r for r, _ in got}) == len(got)  # nothing sent twice
    unrecorded: dict[int, int] = {}
    for rid, _ in got:
        if rid not in recorded:
            unrecorded[sender_of(rid)] = unrecorded.get(sender_of(rid), 0) + 1
    assert set(unrecorded) <= set(faults), unrecorded
    assert all(n <= faults[k] for k, n in unrecorded.items()), (unrecorded, faults)
    if lost_by_ns is not None:
        late = [(rid, ns) for rid, ns in got if sender_of(rid) in faults and ns > lost_by_ns]
        assert not late, late  # a worker declared lost sent again
    return unrecorded


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
    declared lost, every request the server received is recorded once and answered, and the run
    completes."""
    log = tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
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
    assert accounted(folder, log) == {} and len(received(log)) == 150


@pytest.mark.slow
def test_a_frozen_worker_process_is_lost_and_never_sends_again(tmp_path: Path) -> None:
    """A worker process stopped (SIGSTOP) past the silence bound is declared lost, and continued
    (SIGCONT) at once: it sends nothing more (the server's log of what it received says so), the
    other finishes the schedule, and every request the server received is recorded or was held
    by the lost worker and is counted lost."""
    log = tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        proc, out = _sending(tmp_path, 400, emu)
        first, _ = _workers_of(proc.pid)
        os.kill(first, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 120
            while not any(not x.ok for f in (out / "w").iterdir() for x in read_requests(f)):
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
            lost_by_ns = time.perf_counter_ns()
        finally:
            with contextlib.suppress(ProcessLookupError):  # killed as lost, as it should be
                os.kill(first, signal.SIGCONT)
        _, err = proc.communicate(timeout=300)
    (folder,) = (out / "w").iterdir()
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(400))  # each once: sent or lost
    (fault,) = json.loads((folder / "run.json").read_text())["distributed"]["faults"]
    assert "neither records nor a heartbeat" in fault["reason"], fault
    accounted(folder, log, lost_by_ns)
    assert proc.returncode == 4, err


@pytest.mark.slow
def test_ctrl_c_again_and_again_with_workers_exits_130_and_keeps_every_answer(tmp_path: Path) -> None:
    """Ctrl-C, then again every tenth of a second until kvbench has exited: exit 130, no
    traceback, and each request the server received is recorded once (none was lost: nothing
    is in flight when it ends), marked interrupted."""
    log = tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        proc, out = _sending(tmp_path, 400, emu)
        ctrl_c_until_it_ends(proc)
    (folder,) = (out / "w").iterdir()
    interrupted_and_accounted(folder, log)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one-process", "workers"])
def test_ctrl_c_pressed_twice_records_what_was_in_flight_as_cut_short(tmp_path: Path, workers: list[str]) -> None:
    ctrl_c_twice_mid_stream(tmp_path, workers)


def ctrl_c_twice_mid_stream(tmp_path: Path, launch: list[str]) -> None:
    """Ctrl-C, and again a tenth of a second later, while seven streams each have seconds to go
    (launched by `launch`'s options): exit 130, and each request the server received has its
    record, those in flight failed `interrupted` (the stop at once cuts them short; it does not
    leave them out). Distributed, the arm's count balances with none cut short, no worker lost."""
    sc = write_scenario(tmp_path / "w.toml", LOOP.format(requests=70, tokens=2000, scale=1.0))
    sc.write_text(sc.read_text().replace("max_tokens = 8", "max_tokens = 400"))  # 8 s a stream
    log, out = tmp_path / "received.jsonl", tmp_path / "out"
    with EmbeddedEmulator("redbooks-g4", 1.0, timing_log=log) as emu:
        proc = start_kvbench("run", str(sc), "--arm", "reuse", *launch, "--endpoint", emu.base_url, "--out", str(out))
        deadline = time.monotonic() + 180
        while (not log.exists() or not log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)  # the first stream has ended: the next ones are under way
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    (folder,) = (out / "w").iterdir()
    recs = read_requests(folder)
    got = {rid for rid, _ in received(log)}
    assert got <= {x.request_id for x in recs}, got - {x.request_id for x in recs}
    cut = [x for x in recs if x.error_kind == "interrupted"]
    assert len(cut) >= 5 and not any(x.ok for x in cut), [(x.error_kind, x.error) for x in recs]
    assert all((x.error or "").startswith("cut short in flight: the run stopped") for x in cut)
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "interrupted"
    if launch:
        count = meta["distributed"]["accounting"]
        assert count["balanced"] and not count.get("cut_short") and count["recorded"] == len(recs), count
        assert not meta["distributed"]["faults"], meta["distributed"]["faults"]


def ctrl_c_until_it_ends(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C to a running kvbench, then again every tenth of a second until it has exited:
    whatever phase each lands in, exit 130 and no traceback."""
    while proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err


def interrupted_and_accounted(folder: Path, log: Path) -> None:
    """A distributed arm stopped (at once or not): marked interrupted, each scheduled request
    recorded at most once, every request the server received (`log`) recorded once, and the
    arm's count balanced with the records."""
    meta = json.loads((folder / "run.json").read_text())
    assert meta["status"] == "interrupted"
    recs = read_requests(folder)
    assert len({x.schedule_index for x in recs}) == len(recs) >= 6
    assert accounted(folder, log) == {}
    count = meta["distributed"]["accounting"]
    assert count["balanced"] and count["recorded"] == len(recs), count


@pytest.mark.slow
def test_a_killed_coordinator_takes_its_worker_processes_with_it(tmp_path: Path) -> None:
    """SIGKILL of kvbench running two worker processes: they end (their pipe closes: a stop, and
    their dead-man's switch besides), each connection starting at most the one request it was
    about to when the coordinator died, and once they have ended the server receives nothing."""
    log = tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        proc, _ = _sending(tmp_path, 3000, emu)
        workers = _workers_of(proc.pid)
        assert len(workers) == 2
        proc.kill()
        killed_ns = time.perf_counter_ns()
        proc.communicate(timeout=60)
        deadline = time.monotonic() + 60
        while any(_is_worker(p) for p in workers):
            assert time.monotonic() < deadline, "a worker process outlived its coordinator"
            time.sleep(0.1)
        time.sleep(1)  # what was on its way when they ended has been logged
        ended = received(log)
        time.sleep(2)
        assert received(log) == ended  # nothing after their end
    assert sum(ns > killed_ns for _, ns in ended) <= 7  # LOOP's concurrency: one per connection


def _is_worker(pid: int) -> bool:
    """Whether process `pid` is still a running worker process (not gone, nor a zombie)."""
    with contextlib.suppress(OSError):
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False
