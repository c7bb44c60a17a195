"""The distributed layer's parts that need no Ray cluster: the Dispatch's hand-out and start line,
a worker's batch sizes, the clock offset, what crosses from a worker to the coordinator, and the
`[distributed]` section's and `--ray`'s errors (test_ray.py runs them on a local cluster)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.clock import Offset
from harness.distributed import raypool
from harness.distributed.dispatch import (
    CLOSED_BATCH,
    CLOSED_BATCH_S,
    MAX_BATCH,
    OPEN_WINDOW_S,
    START_MARGIN_NS,
    Dispatch,
    FedOrder,
    tagged,
    untagged,
)
from harness.distributed.raypool import RAY_BATCH_S, RayWorker, ration
from harness.results import RequestRecord
from tests.conftest import ROOT, cli, kvbench, write_scenario
from tests.test_workers import LOOP


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


def test_a_workers_actor_vouches_for_its_process_only_while_it_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing from the worker process for two heartbeats: while the process lives and has not
    said it is up (starting, slowly on a busy host), its actor answers with a heartbeat; once up,
    or gone, silence (the coordinator's rule for it decides)."""
    monkeypatch.setattr(raypool, "batch_threads", lambda: None)  # this process is not an actor's
    actor = RayWorker()
    assert actor.shipped() == []  # no process yet
    actor.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert actor.shipped() == [("records", b"")]
        actor.up = True
        assert actor.shipped() == []
        actor.up = False
        actor.proc.kill()
        actor.proc.wait(timeout=60)
        assert actor.shipped() == []
    finally:
        actor.proc.kill()
        actor.proc.wait(timeout=60)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
def test_a_workers_actor_does_not_preempt_its_worker_process() -> None:
    """A worker actor's threads, those there before it and those started after, run on
    SCHED_BATCH (they do not preempt the worker process on its core when they wake); the worker
    process, which inherits that from the actor, goes back to SCHED_OTHER. In a process of its
    own, as an actor is."""
    script = """
import os, threading
from harness.distributed.raypool import RayWorker
from harness.distributed.worker import process_main
before = threading.Thread(target=threading.Event().wait, daemon=True)
before.start()
RayWorker()
after = threading.Thread(target=threading.Event().wait, daemon=True)
after.start()
print(*(os.sched_getscheduler(t.native_id) for t in (threading.main_thread(), before, after)))
r, w = os.pipe()
os.close(w)
process_main(r)  # the pipe's other end is gone: it returns at once
print(os.sched_getscheduler(0))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == [str(os.SCHED_BATCH)] * 3 + [str(os.SCHED_OTHER)]


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
        order = FedOrder(told.append, [], "closed_loop", 4, 0, clock=lambda: now[0])
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
        # a launcher whose asks cost more asks for larger batches (Ray's: raypool.RAY_BATCH_S)
        ray = FedOrder(told.append, [], "closed_loop", 4, 0, RAY_BATCH_S)
        ray.asked_ns, ray.handed = at, 2  # 2,000 per second
        assert ray.wanted(at + 10**6) == round(2_000 * RAY_BATCH_S) > round(2_000 * CLOSED_BATCH_S)
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


def test_a_record_crosses_from_a_worker_to_the_coordinator_intact() -> None:
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
    sc = write_scenario(
        tmp_path / "b.toml", LOOP.format(requests=12, tokens=2000, scale=10.0) + f"\n[distributed]\n{section}\n"
    )
    r = cli("validate", str(sc))
    assert r.returncode == 2 and key in r.stderr and str(sc) in r.stderr, r.stderr


def test_ray_missing_says_how_to_install_it(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['ray'] = None  # as if not installed\n")
    sc = write_scenario(tmp_path / "n.toml", LOOP.format(requests=12, tokens=2000, scale=10.0))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = kvbench("run", str(sc), "--ray", "--out", str(tmp_path / "o"), env=env)
    assert r.returncode == 2 and "pip install 'kvbench[ray]'" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_nothing_but_the_ray_module_imports_ray() -> None:
    for path in (ROOT / "harness").rglob("*.py"):
        if path.name != "raypool.py":
            assert not re.search(r"^\s*(import ray\b|from ray\b)", path.read_text(), re.M), path
