"""`kvbench run --ray`: one run sent from the workers of a local Ray cluster of several nodes
(ray.cluster_utils), against the real emulator; the Dispatch and clock offsets on their own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.clock import Offset
from harness.distributed.dispatch import (
    CLOSED_BATCH,
    CLOSED_BATCH_S,
    MAX_BATCH,
    OPEN_WINDOW_S,
    START_MARGIN_NS,
    Dispatch,
    FedOrder,
)
from harness.distributed.raypool import ration
from harness.emulator.serve import EmbeddedEmulator
from harness.results import RequestRecord, read_requests, read_run
from tests.conftest import (
    ROOT,
    kvbench,
    parent_of,
    processes_with,
    result_lines,
    user_env,
    write_scenario,
)
from tests.test_workers import LOOP, answered

ray = pytest.importorskip("ray")
# A local cluster per module: the file runs on one worker (--dist loadfile), one cluster at a time
pytestmark = [pytest.mark.ray, pytest.mark.slow]

NODES = 3  # each with one CPU: a worker per node; the head node holds none (only the Dispatch)


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


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.integers(1, 40), max_size=6).map(
                lambda ls: ("records", b"".join(b"r" * n + b"\n" for n in ls))
            ),
            st.just(("end", {})),
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(8, 60),
)
def test_a_ray_worker_ships_its_records_in_answers_under_the_inline_limit(items: list[Any], limit: int) -> None:
    # what the coordinator fetches, call after call: the same lines in the same order, whole, each
    # answer within the limit unless one line alone is larger, never an empty answer
    held = deque(items)
    answers = []
    while held:
        answers.append(ration(held, limit))
        assert answers[-1]
    got = [i for a in answers for i in a]
    assert b"".join(i[1] for i in got if i[0] == "records") == b"".join(i[1] for i in items if i[0] == "records")
    assert [i[0] for i in got if i[0] != "records"] == [i[0] for i in items if i[0] != "records"]
    for a in answers:
        lines = b"".join(i[1] for i in a if i[0] == "records")
        assert lines == b"" or lines.endswith(b"\n")
        assert len(lines) <= limit or lines.count(b"\n") == 1


def test_dispatch_hands_out_each_request_once_and_holds_the_start_line() -> None:
    order = [(i, i % 3) for i in range(40)]
    closed = Dispatch(order, [], {0: 1, 1: 1})
    # guided: at most a quarter of each worker's share of what is left, fewer towards the end
    sizes = [len(closed.take(k % 2, 100)) for k in range(12)]
    assert sizes[:3] == [5, 5, 4] and sizes == sorted(sizes, reverse=True) and 1 in sizes
    taken = closed.taken(0) + closed.taken(1)
    assert sorted(taken) == order[: len(taken)] and len(set(taken)) == len(taken)
    while closed.take(0, 100):
        pass
    assert sorted(closed.taken(0) + closed.taken(1)) == order  # each once

    async def start(d: Dispatch, worker: int, ready_ns: int) -> int:
        return await d.start_line(worker, ready_ns)

    async def open_loop() -> None:
        times = [i * OPEN_WINDOW_S / 2 for i in range(40)]  # two due within a window
        # dealt in turn by connections: worker 0 (two) gets two of every three
        timed = Dispatch(order, times, {0: 2, 1: 1})
        assert timed.take(0, 64) == [order[0], order[2]]  # its own due within a window of its first
        assert timed.take(1, 64) == [order[1]]  # the next, 4, is due 0.3 after it
        assert timed.take(0, 1) == [order[3]]
        waiting = asyncio.ensure_future(start(timed, 0, 100))
        await asyncio.sleep(0)
        assert not waiting.done()  # worker 1 is neither ready nor gone
        timed.gone(1)  # lost: what it had not taken goes to worker 0
        # a little later than the last one ready: every worker learns it before its first send
        assert await waiting == 100 + START_MARGIN_NS
        while timed.take(0, 64):
            pass
        assert sorted(timed.taken(0) + timed.taken(1)) == order  # each once, in order per worker
        assert timed.taken(0) == sorted(timed.taken(0)) and timed.taken(1) == [order[1]]
        timed.reset(order, times, {0: 1, 1: 1})
        first = asyncio.ensure_future(start(timed, 0, 100))
        assert await start(timed, 1, 250) == await first == 250 + START_MARGIN_NS  # the latest one ready
        timed.gone(0)  # worker 1 takes its requests
        timed.gone(1)  # the last one lost: they stay its own, lost with it
        assert list(timed.own[1]) == order and not timed.own[0]

    asyncio.run(open_loop())


def test_a_workers_client_asks_for_batches_as_large_as_its_pace_needs() -> None:
    async def closed_loop() -> None:
        told: list[dict[str, int]] = []
        now = [0]  # the pace's clock, ns: the test says how long things took, not the machine
        order = FedOrder(told.append, [], "closed_loop", 4, 0, lambda: now[0])
        first = asyncio.ensure_future(anext(order))
        await asyncio.sleep(0)
        assert told.pop() == {"want": CLOSED_BATCH * 4}  # nothing known of its pace yet
        order.arrive([(i, 0) for i in range(32)])
        assert await first == (0, 0)
        for _ in range(14):
            await anext(order)
        assert not told  # more than half the batch is left: not yet
        now[0] = 1_000
        await anext(order)
        assert told.pop() == {"want": MAX_BATCH}  # 16 handed out in 1 us: as many as it may
        for _ in range(8):
            await anext(order)
        at = order.asked_ns or 0
        # 8 since the last ask: in a second, as few as its connections need; in a millisecond,
        # what it sends in CLOSED_BATCH_S at 8,000 per second
        assert order.wanted(at + 10**9) == CLOSED_BATCH * 4
        assert order.wanted(at + 10**6) == round(8_000 * CLOSED_BATCH_S)
        # a session is long and stays where it goes; an open loop's window is the Dispatch's
        assert FedOrder(told.append, [], "sessions", 4, 0).wanted(at + 10**6) == 1
        assert FedOrder(told.append, [0.0], "open_loop", 4, 0).wanted(at + 10**6) == MAX_BATCH
        # an open loop's start line: on the coordinator's clock in what it tells, on its own here
        timed = FedOrder(told.append, [0.0], "open_loop", 4, 1_000)
        line = asyncio.ensure_future(timed.measured_start(5_000))
        await asyncio.sleep(0)
        assert told.pop() == {"ready_at": 4_000}
        timed.start_at(9_000)
        assert await line == 10_000

    asyncio.run(closed_loop())


def test_clock_offset_comes_from_the_shortest_round_trip() -> None:
    # (sent, read there, received): the other clock is 1,000 ns ahead; slow trips say less
    o = Offset.estimate([(0, 5_000, 8_000), (100, 1_150, 200), (300, 9_000, 2_300)])
    assert o.offset_ns == 1_000 and o.uncertainty_ns == 50 and o.samples == 3


def _run_json(folder: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((folder / "run.json").read_text())
    return meta


def test_closed_loop_over_ray_matches_worker_processes(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(tmp_path / "rl.toml", loop("rl", 60, 10.0))
    r = kvbench("run", str(sc), "--ray", cluster, "--out", str(tmp_path / "ray"), timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{NODES} Ray workers" in r.stderr
    local = kvbench("run", str(sc), "--workers", "2", "--out", str(tmp_path / "local"), timeout=300)
    assert local.returncode == 0, local.stderr
    for arm in ("bust", "reuse"):
        (folder,) = (tmp_path / "ray" / "rl").glob(f"*-{arm}")
        (other,) = (tmp_path / "local" / "rl").glob(f"*-{arm}")
        recs, theirs = read_requests(folder), read_requests(other)
        assert [x.id for x in recs] == list(range(1, 61)) and all(x.ok for x in recs)
        assert [x.start_s for x in recs] == sorted(x.start_s for x in recs)
        # every scheduled request sent exactly once, the same schedule as the worker processes'
        assert sorted((x.schedule_index, x.prompt_id) for x in recs) == sorted(
            (x.schedule_index, x.prompt_id) for x in theirs
        )
        # which worker sent how many depends on each one's pace (a closed loop hands out batches as
        # they are asked for; beside other work one worker may start after the others took all 60)
        assert {x.process for x in recs} <= set(range(NODES)) and len({x.worker for x in recs}) <= 7
        assert sum(x.completion_tokens or 0 for x in recs) == sum(x.completion_tokens or 0 for x in theirs)
        if arm == "bust":
            assert all(x.cached_tokens == 0 for x in recs)
        meta = _run_json(folder)
        assert meta["status"] == "completed" and meta["summary"]["requests"] == meta["summary"]["completed"] == 60
        d = meta["distributed"]
        assert d["engine"] == "ray" and not d["faults"] and len(d["workers"]) == NODES
        for w in d["workers"]:
            # one machine, one monotonic clock: the measured offset is 0 within its uncertainty
            start, end = w["clock_start"], w["clock_end"]
            assert start["uncertainty_ns"] > 0 and abs(start["offset_ns"]) <= start["uncertainty_ns"]
            assert abs(end["offset_ns"]) <= end["uncertainty_ns"] and w["lost"] is None
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
    r = kvbench("run", str(sc), "--ray", cluster, "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 0, r.stderr
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


def _wait(check: Any, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def _sending(
    tmp_path: Path, name: str, address: str, scenario: str = "", worker: int | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """A 150-request closed loop over the cluster (`scenario`'s extra lines added), once its first
    records are in (and, given `worker`, one of that worker's: it has reported something)."""
    sc = write_scenario(tmp_path / f"{name}.toml", loop(name, 150, 1.0) + scenario)
    out = tmp_path / "out"
    proc = _popen(["run", str(sc), "--arm", "reuse", "--ray", address, "--out", str(out)])
    _wait(lambda: result_lines(out) >= 6 and (worker is None or worker in _reported(out)))
    return proc, out


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


def _lost_with(folder: Path) -> int:
    """Every scheduled request is in the file once, sent by a worker or lost with the one worker
    run.json's one fault names (only with it), as many as it says: that worker."""
    recs = read_requests(folder)
    assert sorted(x.schedule_index for x in recs) == list(range(150))
    (fault,) = _run_json(folder)["distributed"]["faults"]
    lost = [x for x in recs if not x.ok]
    # (none when the worker had taken nothing yet: beside other work it may start last)
    assert all(x.error_kind == "lost" and x.process == fault["worker"] for x in lost)
    assert fault["lost_requests"] == len(lost)
    return int(fault["worker"])


def test_a_killed_worker_loses_only_its_requests_and_the_run_goes_on(tmp_path: Path, cluster: str) -> None:
    proc, out = _sending(tmp_path, "rk", cluster, worker=1)
    ray.kill(_worker(1, proc))
    _, err = proc.communicate(timeout=300)
    assert "Ray worker 1" in err and "was lost" in err
    (folder,) = (out / "rk").iterdir()
    assert _lost_with(folder) == 1
    recs = read_requests(folder)
    lost = [x for x in recs if not x.ok]
    assert proc.returncode == (4 if lost else 0), err  # exit 4: requests failed, the lost ones
    if lost:  # what it reported before is kept, and the others went on after its loss
        assert any(x.ok and x.process == 1 for x in recs)
        assert any(x.ok and x.process != 1 and x.start_s > max(y.start_s for y in lost) for x in recs)
    meta = _run_json(folder)
    assert meta["status"] == "completed"
    assert [w["worker"] for w in meta["distributed"]["workers"] if w["lost"]] == [1]
    # the report has a row per worker and says which one was lost
    r = kvbench("report", str(folder), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert "Client processes and hosts" in html and "worker 1 on" in html and "was lost" in html


@pytest.mark.parametrize("victim", ["actor", "process"])
def test_a_worker_whose_process_dies_keeps_what_it_finished(tmp_path: Path, cluster: str, victim: str) -> None:
    """SIGKILL of a worker's actor (Ray says it died) or of the worker process it started (its
    actor's relay says it ended without a word): that worker is lost, and only what it held."""
    proc, out = _sending(tmp_path, f"rp{victim}", cluster, worker=2)
    actor = ray.get(_worker(2, proc).info.remote())["pid"]
    (sender,) = [p for p in processes_with(b"process_main") if parent_of(p) == actor]
    assert b"_raylet" not in Path(f"/proc/{sender}/maps").read_bytes()  # a worker process without Ray in it
    (folder,) = (out / f"rp{victim}").iterdir()
    before = {(x.process, x.schedule_index) for x in read_requests(folder) if x.ok}
    os.kill(actor if victim == "actor" else sender, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert _lost_with(folder) == 2 and "Ray worker 2" in err and "was lost" in err
    if victim == "process":
        assert "its worker process ended without a word" in err
    recs = read_requests(folder)
    lost = [x for x in recs if not x.ok]
    assert proc.returncode == (4 if lost else 0), err  # (none lost if it had nothing in flight)
    # what every worker had finished before, the one that died too, is kept
    assert before <= {(x.process, x.schedule_index) for x in recs if x.ok}


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


def test_a_record_crosses_from_a_worker_to_the_coordinator_intact() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from harness.distributed.dispatch import tagged, untagged

    @given(
        st.booleans(),
        st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False)),
        st.one_of(st.none(), st.integers(0, 10**9)),
        st.one_of(st.none(), st.integers(0, 10**6)),
    )
    def check(ok: bool, ttft: float | None, index: int | None, session: int | None) -> None:
        r = RequestRecord(
            id=7,
            arm="cached",
            phase="run",
            prompt_id="p00001",
            target_tokens=1000,
            prompt_tokens=1000,
            cached_tokens=992,
            completion_tokens=3,
            start_s=0.25,
            ttft_s=ttft,
            first_byte_s=0.01,
            first_content_s=ttft,
            headers_s=0.01,
            e2e_s=0.125,
            itl_s=[0.0125, 0.0],
            ok=ok,
            error=None if ok else "HTTP 500: \t tab\nand a line",
            error_kind=None if ok else "http",
            http_status=200 if ok else 500,
            retried=False,
            process=1,
            schedule_index=index,
            session=session,
        )
        line = tagged(r)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert untagged(line[:-1]) == (r.to_json(), ok, ttft, index, session)

    check()


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
    assert _lost_with(folder) == 0
    lost = [x for x in read_requests(folder) if not x.ok]
    assert proc.returncode == (4 if lost else 0), err  # (none lost if it had taken nothing yet)
    assert [w["node_id"] for w in _run_json(folder)["distributed"]["workers"] if w["worker"] == 0] == [node.node_id]


def test_a_frozen_node_is_declared_lost_by_its_silence(tmp_path: Path, nodes: Any) -> None:
    """SIGSTOP of a node (its raylet and every process under it): no error comes from Ray for a
    long while, but the worker there stops sending records and heartbeats, and is declared lost
    after the scenario's lost_after_s; the others finish the schedule."""
    extra = '\n[distributed]\nengine = "ray"\nlost_after_s = 3\n'
    proc, out = _sending(tmp_path, "rf", str(nodes.address), extra, worker=1)
    node = _node_of(nodes, 1, proc)
    frozen = _tree(node.all_processes["raylet"][0].process.pid)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        nodes.remove_node(node)
        nodes.add_node(num_cpus=1)
        nodes.wait_for_nodes()
    (folder,) = (out / "rf").iterdir()
    assert _lost_with(folder) == 1
    (fault,) = _run_json(folder)["distributed"]["faults"]
    assert "neither records nor a heartbeat for 3 s" in fault["reason"], fault
    lost = [x for x in read_requests(folder) if not x.ok]
    assert proc.returncode == (4 if lost else 0), err


def test_sigterm_under_ray_drains_and_keeps_every_answered_request(tmp_path: Path, cluster: str) -> None:
    """ray.init installs its own SIGTERM handler; kvbench's is put back after it: a SIGTERM (as
    `timeout`, CI cancellation and a pod's deletion send) stops the workers at once, lets them
    finish what is in flight, and every request the server answered has its record."""
    sc = write_scenario(tmp_path / "rt.toml", loop("rt", 400, 1.0))
    out = tmp_path / "out"
    with EmbeddedEmulator("redbooks-g4", 5.0) as emu:
        proc = _popen(
            ["run", str(sc), "--arm", "reuse", "--ray", cluster, "--endpoint", emu.base_url, "--out", str(out)]
        )
        _wait(lambda: result_lines(out) >= 6)
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
    _wait(lambda: result_lines(out) >= 6)
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


def test_ray_from_the_scenario_and_the_bare_flag(tmp_path: Path, cluster: str) -> None:
    """`[distributed]` asks for Ray in the file; a bare --ray joins the cluster RAY_ADDRESS names."""
    body = loop("rd", 12, 10.0)
    sc = write_scenario(
        tmp_path / "d.toml", body + f'\n[distributed]\nengine = "ray"\naddress = "{cluster}"\nworkers = 2\n'
    )
    r = kvbench("run", str(sc), "--arm", "reuse", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "2 Ray workers" in r.stderr
    plain = write_scenario(tmp_path / "p.toml", body)
    r = kvbench(
        "run",
        str(plain),
        "--arm",
        "reuse",
        "--ray",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "b"),
        env={"RAY_ADDRESS": cluster},
    )
    assert r.returncode == 0, r.stderr
    (folder,) = (tmp_path / "b" / "rd").iterdir()
    assert {x.process for x in read_requests(folder)} == {0}


def test_more_workers_than_the_cluster_has_cpus_is_refused(tmp_path: Path, cluster: str) -> None:
    sc = write_scenario(tmp_path / "m.toml", loop("rl", 12, 10.0))
    r = kvbench("run", str(sc), "--ray", cluster, "--workers", str(NODES + 1), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and f"has {NODES} CPU(s)" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ('engine = "dask"', "distributed.engine"),
        ('address = "auto"', "distributed.engine"),  # the engine is required
        ('engine = "ray"\nworkers = 0', "distributed.workers"),
        ('engine = "ray"\naddress = " "', "distributed.address"),
        ('engine = "ray"\nadress = "auto"', "distributed.adress"),
        ('engine = "ray"\nlost_after_s = 1', "distributed.lost_after_s"),  # less than two heartbeats
    ],
)
def test_bad_distributed_section_names_the_key(tmp_path: Path, section: str, key: str) -> None:
    sc = write_scenario(tmp_path / "b.toml", loop("rl", 12, 10.0) + f"\n[distributed]\n{section}\n")
    r = kvbench("validate", str(sc))
    assert r.returncode == 2 and key in r.stderr and str(sc) in r.stderr, r.stderr


def test_ray_missing_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None  # as if not installed\n")
    sc = write_scenario(tmp_path / "n.toml", loop("rl", 12, 10.0))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = kvbench("run", str(sc), "--ray", "--out", str(tmp_path / "o"), env=env)
    assert r.returncode == 2 and "pip install 'kvbench[ray]'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_nothing_but_the_ray_module_imports_ray() -> None:
    for path in (ROOT / "harness").rglob("*.py"):
        if path.name != "raypool.py":
            assert not re.search(r"^\s*(import ray\b|from ray\b)", path.read_text(), re.M), path
