"""The distributed layer's parts that need no Ray cluster: the Dispatch's hand-out and start line,
a worker's batch sizes, the clock offset, what crosses from a worker to the coordinator, and the
`[distributed]` section's and `--ray`'s errors (test_ray.py runs them on a local cluster)."""

from __future__ import annotations

import ast
import asyncio
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core import aio
from harness.core.clock import ModelClock, Offset
from harness.distributed import raypool
from harness.distributed.coordinator import Pool
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
from harness.distributed.messages import Alive, Ended, Items, Lost, ReadyAt, Records, Shipment, Stop, Told, Up, Want
from harness.distributed.raypool import RAY_BATCH_S, RayWorker, ration
from harness.distributed.worker import HEARTBEAT_S, hold_after_s
from harness.inputs.prompts import Prompt
from harness.results import RequestRecord, RunWriter
from harness.workloads.base import Plan, Sender
from tests.conftest import ROOT, cli, kvbench, write_scenario
from tests.test_analysis import rec
from tests.test_workers import LOOP


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.integers(1, 40), max_size=6).map(lambda ls: Records(b"".join(b"r" * n + b"\n" for n in ls))),
            st.just(Ended({}, [], None, False)),
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
    assert _lines(got) == _lines(items)
    assert [i for i in got if not isinstance(i, Records)] == [i for i in items if not isinstance(i, Records)]
    for a in answers:
        lines = _lines(a)
        assert lines == b"" or lines.endswith(b"\n")
        assert len(lines) <= limit or lines.count(b"\n") == 1


def _lines(events: Any) -> bytes:
    return b"".join(e.lines for e in events if isinstance(e, Records))


def test_a_workers_actor_vouches_for_its_process_only_while_it_starts() -> None:
    """Nothing from the worker process for two heartbeats: while the process lives and has not
    said it is up (starting, slowly on a busy host), its actor answers with a heartbeat; once up,
    or gone, silence (the coordinator's rule for it decides)."""
    actor = RayWorker(policy=lambda: None)  # this process is not an actor's: its threads stay as they are
    assert actor.shipped(0, 0) == Shipment(0, [])  # no process yet
    actor.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert actor.shipped(0, 0) == Shipment(0, [Records()])
        actor.up = True
        assert actor.shipped(0, 0) == Shipment(0, [])
        actor.up = False
        actor.proc.kill()
        actor.proc.wait(timeout=60)
        assert actor.shipped(0, 0) == Shipment(0, [])
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
from harness.distributed.ray_entry import main
before = threading.Thread(target=threading.Event().wait, daemon=True)
before.start()
RayWorker()
after = threading.Thread(target=threading.Event().wait, daemon=True)
after.start()
print(*(os.sched_getscheduler(t.native_id) for t in (threading.main_thread(), before, after)))
r, w = os.pipe()
os.close(w)
main(r)  # the pipe's other end is gone: it returns at once
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
        timed = Dispatch(order, times, {0: 1, 1: 1})  # the next arm's
        first = asyncio.ensure_future(start(timed, 0, 100))
        assert await start(timed, 1, 250) == await first == 250 + START_MARGIN_NS  # the latest one ready
        timed.gone(0)  # worker 1 takes its requests
        timed.gone(1)  # the last one lost: they stay its own, lost with it
        assert list(timed.own[1]) == order and not timed.own[0]

    asyncio.run(open_loop())


def test_a_workers_client_asks_for_batches_as_large_as_its_pace_needs() -> None:
    async def closed_loop() -> None:
        told: list[Want | ReadyAt] = []
        now = [0]  # the pace's clock, ns: the test says how long things took, not the machine
        order = FedOrder(told.append, 3, [], "closed_loop", 4, 0, clock=lambda: now[0])
        first = asyncio.ensure_future(anext(order))
        await asyncio.sleep(0)
        assert told.pop() == Want(3, CLOSED_BATCH * 4, 1)  # nothing known of its pace yet
        order.arrive([(i, 0) for i in range(32)], 1)
        order.arrive([(i, 0) for i in range(32, 64)], 1)  # told again (a call made again): taken once
        assert await first == (0, 0)
        for _ in range(14):
            await anext(order)
        assert not told  # more than half the batch is left: not yet
        now[0] = 1_000
        await anext(order)
        assert told.pop() == Want(3, MAX_BATCH, 2)  # 16 handed out in 1 us: as many as it may
        for _ in range(8):
            await anext(order)
        at = order.asked_ns or 0
        # 8 since the last ask: in a second, as few as its connections need; in a millisecond,
        # what it sends in CLOSED_BATCH_S at 8,000 per second
        assert order.wanted(at + 10**9) == CLOSED_BATCH * 4
        assert order.wanted(at + 10**6) == round(8_000 * CLOSED_BATCH_S)
        # a launcher whose asks cost more asks for larger batches (Ray's: raypool.RAY_BATCH_S)
        ray = FedOrder(told.append, 3, [], "closed_loop", 4, 0, RAY_BATCH_S)
        ray.asked_ns, ray.handed = at, 2  # 2,000 per second
        assert ray.wanted(at + 10**6) == round(2_000 * RAY_BATCH_S) > round(2_000 * CLOSED_BATCH_S)
        # a session is long and stays where it goes; an open loop's window is the Dispatch's
        assert FedOrder(told.append, 3, [], "sessions", 4, 0).wanted(at + 10**6) == 1
        assert FedOrder(told.append, 3, [0.0], "open_loop", 4, 0).wanted(at + 10**6) == MAX_BATCH
        # an open loop's start line: on the coordinator's clock in what it tells, on its own here
        timed = FedOrder(told.append, 3, [0.0], "open_loop", 4, 1_000)
        line = asyncio.ensure_future(timed.measured_start(5_000))
        await asyncio.sleep(0)
        assert told.pop() == ReadyAt(3, 4_000)
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


def test_an_ask_made_again_gets_the_same_items_not_new_ones() -> None:
    """A take whose answer was lost on the way (a transient Ray error) is asked again with the
    same number: it gets what it got, and nothing is handed out twice or skipped."""
    d = Dispatch([(i, 0) for i in range(30)], [], {0: 1, 1: 1})
    first = d.take(0, 4, seq=1)
    assert d.take(0, 4, seq=1) == first  # the same ask again
    other = d.take(1, 4, seq=1)  # numbers are per worker
    second = d.take(0, 4, seq=2)
    assert set(first).isdisjoint(second) and set(first + second).isdisjoint(other)
    assert d.taken(0) == first + second  # counted once


def test_a_shipment_is_sent_again_until_it_is_acknowledged() -> None:
    """A fetch whose reply was lost (made again with the same acknowledgement) gets the same
    shipment; acknowledged, the next; nothing is lost and nothing comes twice."""
    actor = RayWorker(policy=lambda: None)  # this process is not an actor's: its threads stay as they are
    actor.out.put(Records(b"a\n"))
    one = actor.shipped(0, 0)
    assert one.events == [Records(b"a\n")] and one.seq == 1
    actor.out.put(Records(b"b\n"))
    assert actor.shipped(0, 0) == one  # the reply was lost: again, not b
    two = actor.shipped(one.seq, 0)
    assert two.events == [Records(b"b\n")] and two.seq == 2
    actor.out.put(Ended({}, [], None, False))
    assert actor.shipped(two.seq, 0).events == [Ended({}, [], None, False)]


def test_only_transient_ray_errors_are_retried_and_only_within_the_bound() -> None:
    unavailable = ray_exceptions().ActorUnavailableError("connection reset", None)
    died = ray_exceptions().ActorDiedError()
    now = [0.0]  # the test says how long passed, not the machine
    retry = raypool.Retry(5.0, clock=lambda: now[0])
    waits = [retry.after(unavailable) for _ in range(8)]
    assert waits[:3] == [raypool.RETRY_S, 2 * raypool.RETRY_S, 4 * raypool.RETRY_S]
    assert max(w or 0 for w in waits) == raypool.RETRY_MAX_S  # doubling, up to a second
    now[0] = 5.5  # past the bound since the first failure: the peer is gone
    assert retry.after(unavailable) is None
    assert raypool.Retry(5.0).after(died) is None  # a death is never retried
    assert raypool.Retry(5.0).after(ValueError("a bug")) is None

    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise unavailable
        return "answered"

    assert asyncio.run(raypool.retried(flaky, 60.0)) == "answered" and len(calls) == 3


def ray_exceptions() -> Any:
    return pytest.importorskip("ray.exceptions")


class _Sink:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.lost: list[RequestRecord] = []
        self.meta: dict[str, Any] = {}

    def add_lines(self, lines: list[bytes]) -> None:
        self.lines += lines

    def add(self, r: RequestRecord) -> None:
        self.lost.append(r)

    def reorder(self) -> None:
        pass


class _Pool(Pool):
    """The coordinator's state machine with workers the test plays itself."""

    noun = one = engine = "fake"

    def __init__(self, n: int, total: int) -> None:
        plan = Plan(
            total,
            tuple(Prompt(f"p{i}", "", "x", None, None) for i in range(total)),
            tuple((i, i) for i in range(total)),
        )
        spec = SimpleNamespace(connections=n, clock=ModelClock(), arm=SimpleNamespace(name="a"))
        progress = SimpleNamespace(start=lambda *_: None, advance=lambda *_: None)
        self.warned: list[str] = []
        sender = SimpleNamespace(
            spec=spec,
            progress=progress,
            warnings=self.warned,
            warn=self.warned.append,
            stop=aio.Stopping(),
            aborted=None,
            seq=0,
        )
        self.out = _Sink()
        super().__init__(cast(Sender, sender), "closed_loop", plan, cast(RunWriter, self.out), list(range(n)), 3600.0)
        self.stopped: set[int] = set()
        self.held: dict[int, list[tuple[int, int]]] = {k: [] for k in range(n)}  # taken, not yet answered
        self.answers: dict[tuple[int, int], list[list[tuple[int, int]]]] = {}  # (worker, ask) -> each answer told

    def send_clock(self, k: int) -> bool:
        return False

    async def start(self) -> None:
        for k in self.shares:
            self.events.put_nowait((k, Up()))

    async def tell(self, k: int, said: Told) -> None:
        match said:
            case Stop():
                self.stopped.add(k)
            case Items(items, seq):
                told = self.answers.setdefault((k, seq), [])
                if not told:  # as a worker's FedOrder takes an answer told again: once
                    self.held[k] += items
                told.append(items)

    def kill(self, k: int) -> None:
        pass

    def vouch(self) -> None:
        pass

    def where(self, k: int) -> dict[str, Any]:
        return {"hostname": "here"}

    async def describe(self) -> dict[str, Any]:
        return {}


HEALTH = {
    "loop_lag_ms": {"p50": None, "p99": None, "max": None, "samples": 0},
    "cpu_share_of_one_core": {"mean": None, "max": None},
    "warning": None,
}
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["take", "again", "answer", "lose", "quit", "stop"]), st.integers(0, 2), st.integers(1, 6)
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(STEPS, st.integers(0, 30))
def test_records_lost_and_unsent_always_add_up_to_the_schedule(steps: list[tuple[str, int, int]], total: int) -> None:
    """Random interleavings of takes (some asked twice), answers, losses, a worker that quits
    before its share ran out (its Dispatch unreachable) and a stop, on the coordinator's real
    state machine: every arm ends with records + lost + unsent = scheduled, each request once;
    unsent only when the run stopped; a worker that quit is a loss, never a silent gap."""

    async def play() -> None:
        pool = _Pool(3, total)
        await pool.ready()
        arm = asyncio.ensure_future(pool.run(ModelClock()))
        held = pool.held
        seq = dict.fromkeys(range(3), 0)
        gone: set[int] = set()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        async def take(k: int, n: int, again: bool) -> None:
            seq[k] += 1
            for _ in range(2 if again else 1):  # asked again (its answer lost on the way)
                pool.events.put_nowait((k, Want(k, n, seq[k])))
            await settle()

        async def answer(k: int) -> None:
            i, _ = held[k].pop(0)
            pool.events.put_nowait((k, Records(tagged(rec(id=i, phase="run", schedule_index=i)))))

        for what, k, n in steps:
            if k in gone or pool.stopping:
                continue
            if what in ("take", "again") and not pool.sender.stop.is_set():
                await take(k, n, what == "again")
            elif what == "answer" and held[k]:
                await answer(k)
            elif what == "lose":
                pool.events.put_nowait((k, Lost("killed")))
                gone.add(k)
            elif what == "quit":
                pool.events.put_nowait((k, Ended(HEALTH, [], None, True)))
                gone.add(k)
            elif what == "stop":
                pool.sender.stop.set()
            await settle()
        for k in sorted(set(range(3)) - gone):  # the rest: to the end of the schedule, or stopped
            while not pool.sender.stop.is_set() and k not in pool.stopped:
                await take(k, 4, False)
                if not held[k]:
                    break
                while held[k]:
                    await answer(k)
            pool.events.put_nowait((k, Ended(HEALTH, [], None, pool.sender.stop.is_set() or k in pool.stopped)))
        await arm

        count = pool.out.meta["distributed"]["accounting"]
        recorded = [json.loads(line)["schedule_index"] for line in pool.out.lines]
        lost = [r.schedule_index for r in pool.out.lost]
        stopped = pool.sender.stop.is_set()
        assert count["balanced"] and count["scheduled"] == total
        assert count["recorded"] == len(recorded) and count["lost"] == len(lost)
        assert len(set(recorded + lost)) == len(recorded) + len(lost)  # each once
        assert count["unsent"] == (total - len(recorded) - len(lost) if stopped else 0)
        if not stopped:
            assert sorted(recorded + lost) == list(range(total))
        assert all(told[1:] == told[:1] * (len(told) - 1) for told in pool.answers.values())  # asked again: the same

    asyncio.run(play())


def test_the_distribution_layer_speaks_only_typed_messages() -> None:
    """What crosses between a worker, its launcher, the coordinator and the Dispatch is one of
    messages.py's types: no dict or tuple literal with a string in it goes into a call that
    carries a message (put, send, tell, hear, a Ray call), anywhere but messages.py. (Each side's
    one handler matches on those types: coordinator.Pool._handle, WorkerSide.hear, Dispatch.answer.)"""
    carriers = {"put", "put_nowait", "send", "_send", "tell", "hear", "remote", "answer", "dispatch"}

    def untyped(node: ast.expr) -> bool:
        parts = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, ast.Tuple) else []
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in parts)

    found = []
    for path in sorted((ROOT / "harness" / "distributed").glob("*.py")):
        if path.name == "messages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if name in carriers and any(untyped(a) for a in node.args):
                    found.append(f"{path.name}:{node.lineno}")
    assert not found


def test_a_worker_that_hears_nothing_from_the_coordinator_sends_nothing_new() -> None:
    """The dead-man's switch: past its bound without a word from the coordinator (dead, cut off,
    paused), a worker hands out no more requests, whatever it holds; the next word lets it go on."""

    async def hold() -> None:
        now = [0]
        order = FedOrder(lambda _: None, 0, [], "closed_loop", 1, 0, clock=lambda: now[0], quiet_ns=100)
        order.arrive([(0, 0), (1, 1), (2, 2)], 1)
        assert await anext(order) == (0, 0)
        now[0] = 150  # silence past the bound
        nxt = asyncio.ensure_future(anext(order))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not nxt.done()  # held, though it has requests
        order.hear()  # Alive
        assert await nxt == (1, 1)

    asyncio.run(hold())


def test_a_stop_hands_out_nothing_more_not_even_to_a_held_worker() -> None:
    """A stop wakes a worker the switch holds (a thawed worker, stopped by its actor when the
    Dispatch was gone): it ends, and what it held is not sent."""

    async def stopped() -> None:
        now = [0]
        order = FedOrder(lambda _: None, 0, [], "closed_loop", 1, 0, clock=lambda: now[0], quiet_ns=100)
        order.arrive([(0, 0), (1, 1), (2, 2)], 1)
        assert await anext(order) == (0, 0)
        now[0] = 150
        nxt = asyncio.ensure_future(anext(order))
        await asyncio.sleep(0)
        order.end()
        with pytest.raises(StopAsyncIteration):
            await nxt
        order.hear()
        with pytest.raises(StopAsyncIteration):
            await anext(order)

    asyncio.run(stopped())


@pytest.mark.parametrize("lost_after_s", [2.0, 3.0, 5.0, 60.0])
def test_a_worker_holds_before_the_coordinator_could_declare_it_lost(lost_after_s: float) -> None:
    """The switch trips before the coordinator's silence bound ends (a thawed worker declared
    lost finds itself holding), and not before a heartbeat has gone by without a word."""
    assert HEARTBEAT_S < hold_after_s(lost_after_s) < lost_after_s


def test_a_fetch_older_than_the_bound_does_not_wake_a_lost_worker() -> None:
    """A fetch is the coordinator's word, relayed to the worker process as Alive; one that waited
    in a frozen node's actor past the liveness bound (its worker declared lost meanwhile) is not."""
    actor = RayWorker(policy=lambda: None)  # this process is not an actor's: its threads stay as they are
    mine, theirs = multiprocessing.Pipe()
    actor.conn = mine
    actor.bound = (0, 5.0)  # the worker's clock offset, the liveness bound
    actor.out.put(Records(b"a\n"))
    actor.shipped(0, time.perf_counter_ns())
    assert theirs.poll() and theirs.recv() == Alive()
    actor.out.put(Records(b"b\n"))
    actor.shipped(1, time.perf_counter_ns() - 6 * 10**9)  # made 6 s ago
    assert not theirs.poll()
