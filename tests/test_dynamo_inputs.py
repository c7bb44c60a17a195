"""What kvbench gives Dynamo, without Dynamo: `[engine] timing` as the mocker is given it
(harness/engines/dynamo.py `write_profile`): the profile's prefill times, interpolated linearly as
the mocker reads them, are kvbench's cost model within the bound its docstring gives, at every
prompt length up to the model's context; its decode time is the same everywhere on its grid; each
worker is pointed at it. And `kvbench size --dynamo`'s inputs to Dynamo's replay
(harness/engines/replay.py): the trace as its Mooncake reader takes it, which configurations it
models, and exit 3 where Dynamo is not installed. The runs with Dynamo are tests/test_dynamo.py's."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.engines import DYNAMO_CONTEXT, MockerTiming
from harness.engines import replay
from harness.engines.dynamo import Workers, write_profile
from harness.inputs.traces import TraceRequest
from harness.sizing.fleet import Fleet, Plan, TierPlan, from_trace
from harness.sizing.planned import Dependent
from harness.sizing.simulate import Cost, Tier
from tests.conftest import kvbench
from tests.test_size_command import sizing_file

# the keys the mocker requires of a profile (dynamo/mocker/args.py's error message lists them)
MOCKER_KEYS = ("prefill_isl", "prefill_ttft_ms", "decode_active_kv_tokens", "decode_context_length", "decode_itl")


@settings(max_examples=30, deadline=None)
@given(
    a=st.floats(0, 1e-3),
    b=st.floats(0, 1e-7),
    d=st.floats(0, 0.1),
    block=st.sampled_from([1, 16, 64, 512]),
)
def test_the_profile_times_every_length_as_the_cost_model_does(a: float, b: float, d: float, block: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:  # (hypothesis runs the test many times on one tmp_path)
        path = write_profile(MockerTiming(a, b, d), Path(tmp) / "t.npz", DYNAMO_CONTEXT, block)
        got = dict(np.load(path))
    assert set(got) == set(MOCKER_KEYS)
    n = np.arange(0, DYNAMO_CONTEXT + 1, dtype=np.float64)
    ms = np.interp(n, got["prefill_isl"], got["prefill_ttft_ms"])
    exact = 1000 * (a * n + b * n * n)
    assert got["prefill_isl"][-1] >= DYNAMO_CONTEXT
    assert np.all(ms >= exact - 1e-9) and np.all(ms - exact <= 1000 * b * block * block / 4 + 1e-9)
    assert got["decode_itl"].shape == (len(got["decode_active_kv_tokens"]), len(got["decode_context_length"]))
    assert np.all(got["decode_itl"] == 1000 * d)


def test_each_worker_is_pointed_at_the_profile_and_none_without_one(tmp_path: Path) -> None:
    timed = Workers(profile=tmp_path / "timing.npz").flags()
    assert timed[timed.index("--planner-profile-data") + 1] == str(tmp_path / "timing.npz")
    assert "--planner-profile-data" not in Workers().flags()


def _plan(*tiers: tuple[str, str, float | None, float], routing: str = "round_robin") -> Plan:
    """A plan of two workers with these tiers (name, scope, read bandwidth, latency)."""
    made = tuple(TierPlan(n, scope, 8, Tier(latency, bw)) for n, scope, bw, latency in tiers)
    return Plan(Fleet(2, 1), made, 1000, Cost(1e-4, 0.0, 0.01), None, 0.99, 1.0, routing)


def test_the_trace_dynamo_replays_has_every_block_of_each_prompt_in_order() -> None:
    """Block ids in kvbench's numbering, shared where the trace shares them; a prompt's last,
    partial block (kvbench keeps no reference of it) an id of its own; at least one output token;
    arrivals in ms from the first."""
    reqs = [
        TraceRequest(line=1, timestamp_s=10.0, input_length=40, output_length=0, hash_ids=(7, 8, 9)),
        TraceRequest(line=2, timestamp_s=10.5, input_length=48, output_length=3, hash_ids=(7, 8, 5)),
    ]
    w = from_trace(reqs, 16, 1.0)
    lines = [json.loads(x) for x in replay.mooncake_lines(w)]
    assert [x["timestamp"] for x in lines] == [0.0, 500.0]
    assert [x["input_length"] for x in lines] == [40, 48] and [x["output_length"] for x in lines] == [1, 3]
    first, second = (x["hash_ids"] for x in lines)
    assert len(first) == 3 and len(second) == 3 and first[:2] == second[:2]
    assert len(set(first) | set(second)) == 4  # 7, 8, 9 and 5: 9 and 5 differ, and neither is 7 or 8


def test_what_dynamos_replay_does_not_model_is_named() -> None:
    w = from_trace([TraceRequest(line=1, timestamp_s=0.0, input_length=32, output_length=1, hash_ids=(1, 2))], 16, 1.0)
    g1, g2 = ("G1", "worker", None, 0.0), ("G2", "worker", 1e9, 0.0)
    assert replay.why_not(w, _plan(g1)) is None and replay.why_not(w, _plan(g1, g2, routing="kv_router")) is None
    cases = [
        (_plan(g1, routing="prefix"), 'routing "prefix"'),
        (_plan(g1, ("G4", "cluster", 1e9, 0.0)), "no tier per node or shared"),
        (_plan(g1, ("G2", "node", 1e9, 0.0)), "no tier per node or shared"),
        (_plan(g1, ("G2", "worker", 1e9, 0.001)), "a latency"),
        (_plan(g1, ("G2", "worker", None, 0.0)), "a free G2"),
        (_plan(("G1", "worker", 1e9, 0.0)), "a G1 read bandwidth"),
    ]
    for plan, why in cases:
        assert why in (replay.why_not(w, plan) or ""), (plan, why)
    plan_of_a_scenario = Dependent.__new__(Dependent)  # (what it holds is not read)
    assert "a scenario's plan" in (replay.why_not(plan_of_a_scenario, _plan(g1)) or "")


def test_dynamo_asked_for_where_it_is_not_installed_exits_3(tmp_path: Path) -> None:
    f = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1GB"\n')
    nowhere = {"KVBENCH_DYNAMO_PYTHON": str(tmp_path / "none"), "KVBENCH_ENGINE_CACHE": str(tmp_path)}
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"), "--dynamo", env=nowhere)
    assert r.returncode == 3 and "--dynamo: Dynamo is not installed here" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()
