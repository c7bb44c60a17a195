"""`kvbench run --ray`: one run sent from the workers of a local Ray cluster of several nodes
(ray.cluster_utils), against the real emulator, and what happens when a worker, a node or the
coordinator is hit (the parts that need no cluster: test_distributed.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.config.scenario import DistributedCfg
from harness.distributed.worker import HEARTBEAT_S
from harness.emulator.serve import EmbeddedEmulator
from harness.results import read_requests, read_run
from tests.conftest import (
    ROOT,
    cli,
    kvbench,
    parent_of,
    processes_with,
    result_lines,
    user_env,
    write_scenario,
)
from tests.test_workers import (
    LOOP,
    accounted,
    answered,
    ctrl_c_twice_mid_stream,
    ctrl_c_until_it_ends,
    interrupted_and_accounted,
    pause_past_the_bound,
    received,
)

ray = pytest.importorskip("ray")
# A local cluster per module: the file runs on one worker (--dist loadfile), one cluster at a time
pytestmark = [pytest.mark.ray, pytest.mark.slow]

NODES = 3  # each with one CPU: a worker per node; the head node holds none (only the coordinator)


def loop(name: str, requests: int, scale: float) -> str:
    """test_workers' closed loop (7 connections, 2,000-token prompts, arms bust and reuse)."""
    return LOOP.format(requests=requests, tokens=2000, scale=scale).replace('name = "w"', f'name = "{name}"', 1)


OPEN = """
name = "ro"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
rate = 20.0
requests = 90
warmup_requests = 3
pool = 8
prompt_tokens = 1000
[[arms]]
name = "cached"
[emulator]
time_scale = 2.0
"""


@pytest.fixture(scope="module")
def nodes() -> Iterator[Any]:
    """A Ray cluster (ray.cluster_utils.Cluster) of NODES nodes on this machine, and this test
    process connected to it."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(NODES):
            c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def cluster(nodes: Any) -> str:
    """The address of the module's cluster."""
    return str(nodes.address)


def _run_json(folder: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((folder / "run.json").read_text())
    return meta


def test_closed_loop_over_ray_matches_worker_processes(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(tmp_path / "rl.toml", loop("rl", 30, 10.0))
    r = kvbench("run", str(sc), "--ray", cluster, "--out", str(tmp_path / "ray"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{NODES} Ray workers" in r.stderr
    local = kvbench("run", str(sc), "--workers", "2", "--out", str(tmp_path / "local"), timeout=300)
    assert local.returncode == 0, local.stderr
    for arm in ("bust", "reuse"):
        (folder,) = (tmp_path / "ray" / "rl").glob(f"*-{arm}")
        (other,) = (tmp_path / "local" / "rl").glob(f"*-{arm}")
        recs, theirs = read_requests(folder), read_requests(other)
        assert [x.id for x in recs] == list(range(1, 31)) and all(x.ok for x in recs)
        assert [x.start_s for x in recs] == sorted(x.start_s for x in recs)
        # every scheduled request sent exactly once, the same schedule as the worker processes'
        assert sorted((x.schedule_index, x.prompt_id) for x in recs) == sorted(
            (x.schedule_index, x.prompt_id) for x in theirs
        )
        # which worker sent how many depends on each one's pace (a closed loop hands out batches as
        # they are asked for; beside other work one worker may start after the others took all 30)
        assert {x.process for x in recs} <= set(range(NODES)) and len({x.worker for x in recs}) <= 7
        assert sum(x.completion_tokens or 0 for x in recs) == sum(x.completion_tokens or 0 for x in theirs)
        if arm == "bust":
            assert all(x.cached_tokens == 0 for x in recs)
        meta = _run_json(folder)
        assert meta["status"] == "completed" and meta["summary"]["requests"] == meta["summary"]["completed"] == 30
        d = meta["distributed"]
        assert d["engine"] == "ray" and not d["faults"] and len(d["workers"]) == NODES
        for w in d["workers"]:
            # one machine, one monotonic clock: the measured offset is 0 within its uncertainty
            start, end = w["clock_start"], w["clock_end"]
            assert start["uncertainty_ns"] > 0 and abs(start["offset_ns"]) <= start["uncertainty_ns"]
            assert abs(end["offset_ns"]) <= end["uncertainty_ns"] and w["lost"] is None
            # it sends at the niceness of the cluster's processes (this one's), not Ray's 15 for its workers
            assert w["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
        health = meta["client_health"]
        assert health["engine"] == "ray" and health["processes"] == NODES
        assert {h["worker"] for h in health["per_process"]} == set(range(NODES))


def test_open_loop_over_ray_sends_each_request_once_on_one_clock(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(tmp_path / "ro.toml", OPEN)
    r = kvbench("run", str(sc), "--ray", cluster, "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 0, r.stderr
    (folder,) = [p for p in (tmp_path / "out" / "ro").iterdir() if p.is_dir()]
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(93)) and all(x.ok for x in recs)
    assert len({x.process for x in recs}) >= 2 and sum(x.phase == "warmup" for x in recs) == 3
    # over all workers, the warm-up is answered before the measured part starts
    warm_end = max(x.end_s() or 0.0 for x in recs if x.phase == "warmup")
    assert min(x.start_s for x in recs if x.phase == "run") >= warm_end
    # each request keeps its intended time on the coordinator's clock: in schedule order
    measured = sorted((x for x in recs if x.phase == "run"), key=lambda x: x.schedule_index or 0)
    intended = [x.intended_s for x in measured]
    assert all(t is not None for t in intended) and intended == sorted(intended)  # type: ignore[type-var]
    meta = read_run(folder).meta
    assert meta["summary"]["schedule_lag"]["requests"] == 90
    # each worker's own schedule lag, of what it sent
    per = meta["client_health"]["per_process"]
    assert sum(h["schedule_lag"]["requests"] for h in per if h["schedule_lag"]) == 90
    # the same plan as worker processes send
    local = kvbench("run", str(sc), "--workers", "2", "--out", str(tmp_path / "local"), timeout=300)
    assert local.returncode == 0, local.stderr
    (other,) = [p for p in (tmp_path / "local" / "ro").iterdir() if p.is_dir()]
    theirs = read_requests(other)
    assert sorted((x.schedule_index, x.prompt_id, x.phase) for x in recs) == sorted(
        (x.schedule_index, x.prompt_id, x.phase) for x in theirs
    )


def test_a_trace_is_replayed_once_over_ray_and_processes_as_in_one(tmp_path: Path, cluster: str) -> None:
    """A trace at its timestamps (and at a concurrency) over two Ray workers, two processes and one
    process: every line sent once, the same requests, and each at its intended time's order."""
    lines = [
        json.dumps({"timestamp": 50 * i, "input_length": 600, "output_length": 4, "hash_ids": [i % 5, 100 + i]})
        for i in range(40)
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    body = f"""
name = "rt"
[endpoint]
max_tokens = 4
[workload]
kind = "trace"
path = "{tmp_path / "t.jsonl"}"
format = "mooncake"
speed = 2.0
[[arms]]
name = "cached"
[emulator]
time_scale = 5.0
"""
    sc = write_scenario(tmp_path / "rt.toml", body)
    got = {}
    for how, extra in (("ray", ["--ray", cluster, "--workers", "2"]), ("two", ["--workers", "2"]), ("one", [])):
        r = kvbench("run", str(sc), *extra, "--out", str(tmp_path / how), timeout=300)
        assert r.returncode == 0, r.stderr
        (folder,) = (tmp_path / how / "rt").iterdir()
        recs = read_requests(folder)
        assert sorted(x.schedule_index for x in recs) == list(range(40)) and all(x.ok for x in recs), how
        by_index = sorted(recs, key=lambda x: x.schedule_index or 0)
        intended = [x.intended_s for x in by_index]
        assert all(t is not None for t in intended) and intended == sorted(intended)  # type: ignore[type-var]
        got[how] = sorted((x.schedule_index, x.prompt_id, x.target_tokens) for x in recs)
        if how != "one":
            assert len({x.process for x in recs}) == 2, how
            assert _run_json(folder)["distributed"]["engine"] == ("ray" if how == "ray" else "processes")
    assert got["ray"] == got["two"] == got["one"]


def test_a_session_stays_on_one_ray_worker(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(
        tmp_path / "s.toml",
        """
name = "rs"
[workload]
kind = "sessions"
users = 6
turns = 3
think_s = 0.5
user_context_tokens = 1000
message_tokens = 40
answer_tokens = 10
[[arms]]
name = "cached"
[emulator]
time_scale = 10.0
""",
    )
    # a bare --ray joins the cluster RAY_ADDRESS names
    r = kvbench("run", str(sc), "--ray", "--out", str(tmp_path / "out"), env={"RAY_ADDRESS": cluster}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{NODES} Ray workers" in r.stderr
    (folder,) = (tmp_path / "out" / "rs").iterdir()
    recs = read_requests(folder)
    assert sorted((x.session, x.turn) for x in recs) == [(u, k) for u in range(6) for k in (1, 2, 3)]
    for u in range(6):
        mine = sorted((x for x in recs if x.session == u), key=lambda x: x.turn or 0)
        assert len({x.process for x in mine}) == 1  # its history and cache, as in one process
        assert [x.start_s for x in mine] == sorted(x.start_s for x in mine)
        assert all((x.cached_tokens or 0) > 0 for x in mine[1:])


def _popen(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env=env or user_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(check: Any, run: subprocess.Popen[str] | None = None, timeout: float = 240) -> None:
    """Until `check()`; a guard against a hang only (generous: a busy machine starts Ray's workers
    slowly; within pytest's own per-test limit), and a run that ended meanwhile says why."""
    deadline = time.monotonic() + timeout
    while not check():
        if run is not None and run.poll() is not None:
            raise AssertionError(f"the run ended first (exit {run.returncode}): {run.communicate()[1]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _sending(
    tmp_path: Path, name: str, address: str, scenario: str = "", workers: tuple[int, ...] = (), endpoint: str = ""
) -> tuple[subprocess.Popen[str], Path]:
    """A 150-request closed loop over the cluster (`scenario`'s extra lines added; against
    `endpoint`, or the embedded emulator), once its first records are in (and one of each of
    `workers`: each has reported something)."""
    sc = write_scenario(tmp_path / f"{name}.toml", loop(name, 150, 2.0) + scenario)
    out = tmp_path / "out"
    there = ["--endpoint", endpoint] if endpoint else []
    proc = _popen(["run", str(sc), "--arm", "reuse", "--ray", address, "--out", str(out), *there])
    _wait(lambda: result_lines(out) >= 6 and set(workers) <= _reported(out), proc)
    return proc, out


def _run_on(address: str, sc: Path, out: Path, endpoint: str) -> subprocess.Popen[str]:
    """`kvbench run` of `sc`'s arm "reuse" over the Ray cluster at `address` against `endpoint`,
    into `out`, once its first six records are in."""
    proc = _popen(["run", str(sc), "--arm", "reuse", "--ray", address, "--endpoint", endpoint, "--out", str(out)])
    _wait(lambda: result_lines(out) >= 6, proc)
    return proc


def _reported(out: Path) -> set[int]:
    """The workers with a record in the run's file so far."""
    return {
        json.loads(line)["process"]
        for p in out.glob("*/*/requests.jsonl")
        for line in p.read_bytes().splitlines()
        if line.strip()
    }


def _worker(k: int, run: subprocess.Popen[str]) -> Any:
    """Worker actor k of the run `run` started (its namespace names its pid: an earlier test's
    actors of the same name may still be ending on a busy machine)."""
    (victim,) = [
        a
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"] == f"worker-{k}" and a["namespace"].startswith(f"kvbench-{run.pid}-")
    ]
    return ray.get_actor(f"worker-{k}", namespace=victim["namespace"])


def _lost_with(folder: Path, requests: int = 150) -> set[int]:
    """Every scheduled request is in the file once, sent by a worker or lost with a worker one of
    run.json's faults names (only with it), as many as that fault says: those workers."""
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(requests))
    faults = {f["worker"]: f for f in _run_json(folder)["distributed"]["faults"]}
    lost = [x for x in recs if not x.ok]
    # (none when the worker had taken nothing yet: beside other work it may start last)
    assert all(x.error_kind == "lost" and x.process in faults for x in lost)
    for k, fault in faults.items():
        assert fault["lost_requests"] == sum(x.process == k for x in lost)
    return set(faults)


def test_workers_whose_actor_or_process_dies_lose_only_what_they_held(tmp_path: Path, cluster: str) -> None:
    """In one run, SIGKILL of worker 1's actor (Ray says it died) and of the worker process worker
    2's actor started (its relay says it ended without a word): each is lost, named, with only
    the requests it held; what every worker had finished before is kept, and worker 0 goes on
    with the rest. The report has a row per worker and says which were lost."""
    proc, out = _sending(tmp_path, "rk", cluster, workers=(1, 2))
    actor = ray.get(_worker(1, proc).info.remote())["pid"]
    holder = ray.get(_worker(2, proc).info.remote())["pid"]
    (sender,) = [p for p in processes_with(b"ray_entry") if parent_of(p) == holder]
    assert b"_raylet" not in Path(f"/proc/{sender}/maps").read_bytes()  # a worker process without Ray in it
    (folder,) = (out / "rk").iterdir()
    before = {(x.process, x.schedule_index) for x in read_requests(folder) if x.ok}
    os.kill(actor, signal.SIGKILL)
    os.kill(sender, signal.SIGKILL)
    _, err = proc.communicate(timeout=240)
    assert _lost_with(folder) == {1, 2}, err
    assert "Ray worker 1" in err and "Ray worker 2" in err and "was lost" in err
    assert "its worker process ended without a word" in err
    recs = read_requests(folder)
    lost = [x for x in recs if not x.ok]
    assert proc.returncode == (4 if lost else 0), err  # exit 4: requests failed, the lost ones
    assert before <= {(x.process, x.schedule_index) for x in recs if x.ok}
    if lost:  # the one left went on after their loss
        assert any(x.ok and x.process == 0 and x.start_s > max(y.start_s for y in lost) for x in recs)
    meta = _run_json(folder)
    assert meta["status"] == "completed"
    assert [w["worker"] for w in meta["distributed"]["workers"] if w["lost"]] == [1, 2]
    r = cli("report", str(folder), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert "Client processes and hosts" in html and "worker 1 on" in html and "was lost" in html


def _node_of(nodes: Any, k: int, run: subprocess.Popen[str]) -> Any:
    """The cluster node worker actor k of the run `run` is on."""
    node_id = ray.get(_worker(k, run).info.remote())["node_id"]
    (node,) = [n for n in nodes.worker_nodes if n.node_id == node_id]
    return node


def _tree(pid: int) -> list[int]:
    """A process and every process under it."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            children.setdefault(parent_of(int(p.name)), []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        out.append(q := todo.pop())
        todo += children.get(q, [])
    return out


def test_a_node_that_dies_takes_only_its_worker_with_it(tmp_path: Path, nodes: Any) -> None:
    proc, out = _sending(tmp_path, "rn", nodes.address)
    node = _node_of(nodes, 0, proc)
    try:
        nodes.remove_node(node)
        _, err = proc.communicate(timeout=300)
    finally:
        nodes.add_node(num_cpus=1)  # the cluster as the other tests expect it
        nodes.wait_for_nodes()
    (folder,) = (out / "rn").iterdir()
    assert _lost_with(folder) == {0}
    lost = [x for x in read_requests(folder) if not x.ok]
    assert proc.returncode == (4 if lost else 0), err  # (none lost if it had taken nothing yet)
    assert [w["node_id"] for w in _run_json(folder)["distributed"]["workers"] if w["worker"] == 0] == [node.node_id]


def _lost_records(out: Path, k: int) -> bool:
    """Whether worker k has been declared lost: its lost records are in the run's file."""
    return any(
        x.error_kind == "lost" and x.process == k for folder in (out / "rf").iterdir() for x in read_requests(folder)
    )


@pytest.mark.parametrize("thawed", ["while the run goes on", "once it has ended"])
def test_a_frozen_node_is_declared_lost_by_its_silence(tmp_path: Path, nodes: Any, thawed: str) -> None:
    """SIGSTOP of a node (its raylet and every process under it): no error comes from Ray for a
    long while, but the worker there stops sending records and heartbeats, and is declared lost
    after the scenario's lost_after_s; the others finish the schedule. Thawed, while the run goes
    on or once it is over, the lost worker sends nothing more (the server's log of what it
    received says so): nobody tells it the coordinator is there, and what its actor was asked
    while frozen is too old to count. Every request the server received is recorded, or was held
    by the lost worker and is counted lost."""
    extra = '\n[distributed]\nengine = "ray"\nlost_after_s = 3\n'
    log = tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        requests = 400 if thawed == "while the run goes on" else 150
        sc = write_scenario(tmp_path / "rf.toml", loop("rf", requests, 2.0) + extra)
        out = tmp_path / "out"
        proc = _run_on(str(nodes.address), sc, out, emu.base_url)
        _wait(lambda: 1 in _reported(out), proc)
        node = _node_of(nodes, 1, proc)
        frozen = _tree(node.all_processes["raylet"][0].process.pid)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            if thawed == "while the run goes on":
                _wait(lambda: _lost_records(out, 1), proc)
            else:
                proc.wait(timeout=300)
            lost_by_ns = time.perf_counter_ns()
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        try:
            _, err = proc.communicate(timeout=300)
            time.sleep(3 + HEARTBEAT_S + 2)  # thawed past its bound: the switch, not a timing
        finally:
            nodes.remove_node(node)
            nodes.add_node(num_cpus=1)
            nodes.wait_for_nodes()
    (folder,) = (out / "rf").iterdir()
    assert _lost_with(folder, requests) == {1}
    (fault,) = _run_json(folder)["distributed"]["faults"]
    assert "neither records nor a heartbeat for 3 s" in fault["reason"], fault
    accounted(folder, log, lost_by_ns)
    lost = [x for x in read_requests(folder) if not x.ok]
    assert proc.returncode == (4 if lost else 0), err


def test_sigterm_under_ray_drains_and_keeps_every_answered_request(tmp_path: Path, cluster: str) -> None:
    """ray.init runs outside the main thread, so it puts no SIGTERM handler of its own in place of
    kvbench's: a SIGTERM (as `timeout`, CI cancellation and a pod's deletion send) stops the
    workers at once, lets them finish what is in flight, and every request the server answered
    has its record."""
    sc = write_scenario(tmp_path / "rt.toml", loop("rt", 400, 1.0))
    out = tmp_path / "out"
    with EmbeddedEmulator("redbooks-g4", 5.0) as emu:
        proc = _run_on(cluster, sc, out, emu.base_url)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        served = answered(emu.base_url)
    assert proc.returncode == 130, err
    (folder,) = (out / "rt").iterdir()
    meta = _run_json(folder)
    assert (
        meta["status"] == "interrupted" and meta["distributed"]["engine"] == "ray" and not meta["distributed"]["faults"]
    )
    recs = read_requests(folder)
    assert 6 <= len(recs) < 400 and len({x.schedule_index for x in recs}) == len(recs)
    assert sum(x.ok for x in recs) == served  # every answer recorded, nothing recorded twice


def test_a_cluster_short_of_cpus_says_so_in_seconds(tmp_path: Path, cluster: str) -> None:
    """Two of the three CPUs held by other work: three workers cannot be placed, and the run says
    so (after the placement timeout) instead of waiting for the CPUs."""
    from ray.util.placement_group import placement_group, remove_placement_group

    held = placement_group([{"CPU": 1}] * 2, strategy="SPREAD")
    ray.get(held.ready(), timeout=60)
    try:
        sc = write_scenario(tmp_path / "rc.toml", loop("rc", 12, 10.0))
        r = kvbench("run", str(sc), "--ray", cluster, "--out", str(tmp_path / "o"))
    finally:
        remove_placement_group(held)
    assert r.returncode == 3, r.stderr
    assert f"could not give {NODES} worker(s) a CPU each" in r.stderr and "1 of its 3 CPU(s) free" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_ctrl_c_stops_every_ray_worker_and_keeps_merged_partial_results(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(tmp_path / "c.toml", loop("rc", 400, 1.0))
    out = tmp_path / "out"
    proc = _popen(["run", str(sc), "--arm", "reuse", "--ray", cluster, "--out", str(out)])
    _wait(lambda: result_lines(out) >= 6, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    (folder,) = (out / "rc").iterdir()
    assert _run_json(folder)["status"] == "interrupted"
    recs = read_requests(folder)
    assert 6 <= len(recs) < 400 and [x.id for x in recs] == list(range(1, len(recs) + 1))
    assert len({x.schedule_index for x in recs}) == len(recs)
    # every worker stopped: none is left running in the cluster
    _wait(lambda: not any(a["name"].startswith("worker-") for a in ray.util.list_named_actors(all_namespaces=True)))


def test_ray_from_the_scenario(tmp_path: Path, cluster: str) -> None:
    """`[distributed]` asks for Ray, and for fewer workers than the cluster has CPUs, in the file
    (a bare --ray with RAY_ADDRESS: test_a_session_stays_on_one_ray_worker)."""
    body = loop("rd", 12, 10.0)
    sc = write_scenario(
        tmp_path / "d.toml", body + f'\n[distributed]\nengine = "ray"\naddress = "{cluster}"\nworkers = 2\n'
    )
    r = kvbench("run", str(sc), "--arm", "reuse", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "2 Ray workers" in r.stderr
    (folder,) = (tmp_path / "a" / "rd").iterdir()
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(12)) and {x.process for x in recs} <= {0, 1}


def test_more_workers_than_the_cluster_has_cpus_is_refused(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(tmp_path / "m.toml", loop("rl", 12, 10.0))
    r = kvbench("run", str(sc), "--ray", cluster, "--workers", str(NODES + 1), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and f"has {NODES} CPU(s)" in r.stderr, r.stderr


def _listening(pid: int) -> set[str]:
    """The TCP addresses (ip:port) process `pid` listens on."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3] for line in out.splitlines() if f"pid={pid}," in line}


def _reset(client: int, server: int) -> int:
    """A TCP reset (`ss -K`) of every connection process `client` holds to an address process
    `server` listens on, as a flaky network or a restarted proxy gives: how many."""
    served = {a.rsplit(":", 1)[1] for a in _listening(server)}
    out = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True, check=True).stdout
    n = 0
    for line in out.splitlines():
        _, _, local, peer, *rest = line.split()
        if f"pid={client}," not in " ".join(rest) or peer.rsplit(":", 1)[1] not in served:
            continue
        (lip, lport), (pip, pport) = local.rsplit(":", 1), peer.rsplit(":", 1)
        args = ["src", lip, "sport", "=", f":{lport}", "dst", pip, "dport", "=", f":{pport}"]
        n += subprocess.run(["ss", "-K", *args], capture_output=True, check=False).returncode == 0
    return n


def _all_answered_once(folder: Path, served: int, requests: int, log: Path) -> None:
    """Nothing lost, nothing twice: every scheduled request recorded once and answered, as many
    as the server answered, each id in the server's log of what it served (`log`) a record's
    `request_id` once, and the arm's count balanced with no fault."""
    meta = _run_json(folder)
    assert meta["status"] == "completed" and not meta["distributed"]["faults"], meta["distributed"]["faults"]
    assert meta["distributed"]["accounting"] == {
        "scheduled": requests,
        "recorded": requests,
        "lost": 0,
        "unsent": 0,
        "balanced": True,
    }
    recs = read_requests(folder)
    assert len({(x.schedule_index, x.session, x.turn) for x in recs}) == len(recs) == requests == served
    assert all(x.ok for x in recs)
    received = sorted(json.loads(line)["request_id"] for line in log.read_text().splitlines())
    assert sorted(str(x.request_id) for x in recs) == received and len(set(received)) == served


# Single-turn sessions: a session is the unit a worker asks the Dispatch for (batch_limit 1), so
# its asks and their answers are as many as its requests, and resets find them in flight.
ASKING = """
name = "{name}"
[workload]
kind = "sessions"
users = {requests}
turns = 1
think_s = 0
message_tokens = 40
answer_tokens = 4
max_active = 6
[[arms]]
name = "cached"
"""


@pytest.mark.parametrize("carrying", ["records", "asks"])
def test_connection_resets_are_retried_and_lose_nothing(tmp_path: Path, cluster: str, carrying: str) -> None:
    """Ray connections between the coordinator and each worker's actor reset again and again
    while calls are in flight (`ss -K`), as they carry records (a closed loop's fetches, nearly
    always in flight: one reset used to declare a healthy worker lost) or asks for requests and
    their answers (single-turn sessions, an ask per request: one reset used to end a worker
    quietly, its requests never sent nor counted, exit 0). Each failed call is made again; no ask
    is answered twice, nothing is lost or recorded twice, no worker is declared lost, and the run
    completes."""
    name, requests = f"rr{carrying[0]}", 300
    body = loop(name, requests, 1.0) if carrying == "records" else ASKING.format(name=name, requests=requests)
    sc = write_scenario(tmp_path / f"{name}.toml", body)
    out = tmp_path / "out"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=tmp_path / "served.jsonl") as emu:
        args = ["run", str(sc), "--ray", cluster, "--endpoint", emu.base_url, "--out", str(out)]
        proc = _popen(args + (["--arm", "reuse"] if carrying == "records" else []))
        _wait(lambda: result_lines(out) >= 6 and {0, 1, 2} <= _reported(out), proc)
        actors = [ray.get(_worker(k, proc).info.remote())["pid"] for k in range(NODES)]
        pairs = [(proc.pid, a) for a in actors]
        resets = 0
        while proc.poll() is None:  # to its end
            resets += sum(_reset(client, server) for client, server in pairs)
            time.sleep(0.02)
        _, err = proc.communicate(timeout=240)
        served = answered(emu.base_url)
    assert resets > 0  # connections were cut
    assert proc.returncode == 0, err
    (folder,) = (out / name).iterdir()
    _all_answered_once(folder, served, requests, tmp_path / "served.jsonl")


def test_a_paused_coordinator_blames_no_ray_worker(tmp_path: Path, cluster: str) -> None:
    """kvbench stopped (SIGSTOP) for longer than the silence after which a worker is lost, then
    continued: its pause is nobody's silence. The workers' records held in their actors
    meanwhile are fetched, none is declared lost, and the run completes."""
    sc = write_scenario(tmp_path / "rp.toml", loop("rp", 300, 1.0))
    out = tmp_path / "out"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=tmp_path / "served.jsonl") as emu:
        proc = _run_on(cluster, sc, out, emu.base_url)
        _wait(lambda: {0, 1, 2} <= _reported(out), proc)
        pause_past_the_bound(proc, out, 300, emu.base_url)
        _, err = proc.communicate(timeout=240)
        served = answered(emu.base_url)
    assert proc.returncode == 0, err
    (folder,) = (out / "rp").iterdir()
    _all_answered_once(folder, served, 300, tmp_path / "served.jsonl")


def test_ctrl_c_pressed_again_and_again_through_the_teardown_exits_130_without_a_traceback(
    tmp_path: Path, cluster: str
) -> None:
    """Ctrl-C, then Ctrl-C again every tenth of a second until kvbench has exited: whatever phase
    of the stop and of Ray's teardown each lands in, exit 130, no traceback, and what was
    recorded is readable and marked interrupted."""
    sc = write_scenario(tmp_path / "cc.toml", loop("cc", 400, 1.0))
    out, log = tmp_path / "out", tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        proc = _run_on(cluster, sc, out, emu.base_url)
        ctrl_c_until_it_ends(proc)
    (folder,) = (out / "cc").iterdir()
    interrupted_and_accounted(folder, log)


def test_ctrl_c_pressed_twice_records_what_the_ray_workers_had_in_flight(tmp_path: Path, cluster: str) -> None:
    """The second press cuts short what each Ray worker has in flight and ships its records
    before the run ends: none of what the server received goes unrecorded (it was, 1 in 6
    whole-suite runs, counted unsent by a stop that stopped collecting)."""
    ctrl_c_twice_mid_stream(tmp_path, ["--ray", cluster])


def test_joining_an_address_where_nothing_answers_fails_in_seconds_and_a_signal_stops_the_join(
    tmp_path: Path,
) -> None:
    """Nothing listening at --ray's address: exit 3 with kvbench's message (Ray alone retried
    for minutes). Something listening that is not a Ray cluster (the join hangs): SIGTERM ends
    it with exit 130, kvbench's own handling in force while Ray connects."""
    sc = write_scenario(tmp_path / "j.toml", loop("j", 10, 1.0))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    r = kvbench("run", str(sc), "--ray", f"127.0.0.1:{port}", "--out", str(tmp_path / "o"), timeout=120)
    assert r.returncode == 3 and "nothing answers there" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with socket.socket() as silent, contextlib.ExitStack() as held:
        silent.bind(("0.0.0.0", 0))  # Ray connects to this host's address for 127.0.0.1
        silent.listen(64)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        proc = _popen(["run", str(sc), "--ray", address, "--out", str(tmp_path / "o")])
        silent.settimeout(120)  # a guard against a hang only
        # kvbench's check that something answers, then Ray's own connection: it is joining
        for _ in range(2):
            held.enter_context(silent.accept()[0])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Interrupted while joining" in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def client_address(nodes: Any) -> Iterator[str]:
    """Ray Client (`ray://`, as KubeRay's head service offers) in front of the module's cluster."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "ray.util.client.server", f"--address={nodes.address}"),
            *("--host=127.0.0.1", f"--port={port}", "--mode=legacy"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: _accepts(port))
        yield f"ray://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait()


def _accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def test_workers_stop_sending_once_a_ray_client_coordinator_is_killed(tmp_path: Path, client_address: str) -> None:
    """SIGKILL of kvbench joined through Ray Client: Ray keeps its job, and so its workers, for
    the client's reconnect grace (30 s), and they used to send thousands of requests that nobody
    recorded. With no word from the coordinator for the liveness bound and a heartbeat, each
    worker sends nothing new (the dead-man's switch): the server's count stands still."""
    sc = write_scenario(tmp_path / "rk.toml", loop("rk", 3000, 1.0))
    out, log = tmp_path / "out", tmp_path / "received.jsonl"
    with EmbeddedEmulator("redbooks-g4", 5.0, timing_log=log) as emu:
        proc = _run_on(client_address, sc, out, emu.base_url)
        proc.kill()
        proc.communicate(timeout=60)
        time.sleep(DistributedCfg.lost_after_s + HEARTBEAT_S + 1)  # the silence, not a timing
        held = received(log)
        time.sleep(2)
        assert received(log) == held  # the server receives nothing more


def test_a_sizing_sweep_on_ray_gives_what_it_gives_on_this_host(tmp_path: Path, cluster: str) -> None:
    """`kvbench size --ray ADDRESS --workers 2`: a sweep of four configurations sized by Ray's
    multiprocessing pool on the cluster's nodes; each configuration's figures equal those sized
    in this process, and sizing.json says where it was sized."""
    pytest.importorskip("numba")
    text = (ROOT / "scenarios" / "sizing" / "fleet.toml").read_text()
    bandwidths = '["1GB/s", "5GB/s", "10GB/s", "40GB/s"]'
    f = tmp_path / "fleet.toml"
    f.write_text(text.replace('"../traces/', f'"{ROOT}/scenarios/traces/').replace('"10GB/s"', bandwidths))
    docs = []
    for where, args in (("ray", ["--ray", cluster, "--workers", "2"]), ("here", [])):
        r = kvbench("size", str(f), "--out", str(tmp_path / where), *args, timeout=600)
        assert r.returncode == 0, r.stderr
        docs.append(json.loads(next((tmp_path / where).glob("*/*/sizing.json")).read_text()))
    on_ray, here = docs
    assert on_ray["sized_by"] == {"processes": 2, "ray": cluster} and here["sized_by"]["ray"] is None
    assert len(on_ray["configurations"]) == 4 and on_ray["status"] == "completed"
    assert [c["figures"] for c in on_ray["configurations"]] == [c["figures"] for c in here["configurations"]]
