"""`kvbench size` of a scenario's plan (`[workload] scenario`, sizing/planned.py): the kinds'
plans in tokens, the arrivals as answers allow them (a session's think time after the turn before,
slots taken in order), the settling passes, and sessions worked by hand through the command."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.kinds import figures_of
from harness.config import scenario
from harness.inputs.traces import TraceRequest
from harness.sizing.planned import MAX_PASSES, SETTLE_S, Dependent, Ordered, arrivals, settle
from harness.sizing.stack import references
from tests.conftest import ROOT, kvbench, write_scenario
from tests.test_size_command import sizing_file

pytest.importorskip("numba")  # the sizing extra


def plan(ready: list[float], first: list[bool], slots: int | None = None, rate_scale: float = 1.0) -> Dependent:
    """A plan of len(ready) two-block requests of their own (no prompt shared)."""
    n = len(ready)
    refs = references([TraceRequest(i + 1, float(i), 32, 1, (2 * i, 2 * i + 1)) for i in range(n)], 16)
    tokens = np.full(n, 32)
    return Dependent(refs, tokens, np.ones(n), np.array(ready), np.array(first), slots, 16, rate_scale)


def test_a_later_turn_arrives_its_think_time_after_the_turn_before_ended() -> None:
    """Two sessions of two turns starting at 0 and 1 s, 5 s of thinking in the first, 2 in the
    second; each request lasts its duration from its arrival."""
    d = plan([0.0, 5.0, 1.0, 2.0], [True, False, True, False])
    got = arrivals(d, np.array([1.0, 1.0, 3.0, 1.0]))
    assert got.tolist() == [0.0, 1.0 + 5.0, 1.0, 1.0 + 3.0 + 2.0]
    # twice as fast: the plan's times (starts and think times) halved, the answers' as long
    fast = arrivals(d, np.array([1.0, 1.0, 3.0, 1.0]), speed=2.0)
    assert fast.tolist() == [0.0, 1.0 + 2.5, 0.5, 0.5 + 3.0 + 1.0]
    assert (
        arrivals(plan([0.0, 5.0, 1.0, 2.0], [True, False, True, False], rate_scale=2.0), np.ones(4)).tolist()
        == (fast - np.array([0, 0, 0, 2.0])).tolist()
    )


def test_groups_take_their_slots_in_order_and_hold_them_to_their_last_end() -> None:
    """A closed loop of two connections: three requests each a group, ready at once, lasting 1, 2
    and 3 s: the third is sent when the first ends. Sessions, one at a time: the second session
    starts when the first's last turn ends, even though it was ready at once; one ready later
    than that starts when it is ready."""
    loop = plan([0.0, 0.0, 0.0], [True, True, True], slots=2)
    assert arrivals(loop, np.array([1.0, 2.0, 3.0])).tolist() == [0.0, 0.0, 1.0]
    one_at_a_time = plan([0.0, 1.0, 0.0, 10.0], [True, False, True, True], slots=1)
    # session 0: 0 -> 2, thinks 1, 3 -> 5; session 1 from 5 (ready at 0), lasts 2; session 2 at 10
    assert arrivals(one_at_a_time, np.array([2.0, 2.0, 2.0, 1.0])).tolist() == [0.0, 3.0, 5.0, 10.0]
    # slots are taken in the groups' order: a group never overtakes the one before it
    order = plan([0.0, 0.0, 0.0], [True, True, True], slots=2)
    assert arrivals(order, np.array([5.0, 1.0, 1.0])).tolist() == [0.0, 0.0, 1.0]


def test_arrivals_settle_where_the_answers_they_give_lead_to_the_same_arrivals() -> None:
    """A pass whose durations depend on the arrivals (a request lasts longer the more requests
    arrived within a second before it): the arrivals settled are those the last pass's durations
    give, within SETTLE_S; durations that do not depend on them settle after one pass."""
    d = plan([0.0, 0.5, 0.2, 0.5, 0.1, 0.5], [True, False, True, False, True, False], slots=2)

    def crowded(at: Ordered) -> tuple[np.ndarray, None]:
        t = at.arrival_s
        return 1.0 + np.array([np.sum((t < x) & (t >= x - 1.0)) for x in t]) * 0.25, None

    got = settle(d, 1.0, np.ones(6), crowded)
    assert got.settled and 1 < got.passes < MAX_PASSES and got.change_s <= SETTLE_S
    lasted = np.empty(6)
    lasted[got.ordered.order] = crowded(got.ordered)[0]
    assert np.max(np.abs(arrivals(d, lasted)[got.ordered.order] - got.ordered.arrival_s)) <= SETTLE_S
    assert list(got.ordered.arrival_s) == sorted(got.ordered.arrival_s)

    fixed = settle(d, 1.0, np.full(6, 2.0), lambda at: (np.full(6, 2.0), None))
    assert fixed.settled and fixed.passes == 1


def test_arrivals_that_do_not_settle_are_said_to_be_so() -> None:
    """A turn whose answer is slow when its next turn would come before another session's first
    request, and fast when after (2 s or 0.5 s, the other at 1 s): each pass turns the order
    round. The last of MAX_PASSES passes is kept, marked unsettled."""
    d = plan([0.0, 0.0, 1.0], [True, False, True])

    def swings(at: Ordered) -> tuple[np.ndarray, None]:
        lasted = np.ones(3)
        lasted[0] = 2.0 if at.order[1] == 1 else 0.5  # (the session's first turn arrives first)
        return lasted, None

    got = settle(d, 1.0, np.ones(3) * 0.5, swings)
    assert not got.settled and got.passes == MAX_PASSES and got.change_s == pytest.approx(1.5)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 200), st.lists(st.integers(0, 9), max_size=12)), min_size=1, max_size=12),
    st.randoms(use_true_random=False),
)
def test_references_reordered_are_those_of_the_requests_in_that_order(
    prompts: list[tuple[int, list[int]]], rng: Any
) -> None:
    """The plan's references built once and reordered at each pass are the references of its
    requests built in the new order, and their block numbering tells the same blocks apart."""
    requests = [TraceRequest(i + 1, float(i), n, 1, tuple(ids)) for i, (n, ids) in enumerate(prompts)]
    order = list(range(len(requests)))
    rng.shuffle(order)
    got = references(requests, 16).reordered(np.array(order))
    want = references([replace(requests[i], timestamp_s=float(k)) for k, i in enumerate(order)], 16)
    assert got.blocks.tolist() == want.blocks.tolist() and got.request.tolist() == want.request.tolist()
    assert got.serves.tolist() == want.serves.tolist() and got.requests == want.requests
    dense, n = got.dense
    pairs = set(zip(got.blocks.tolist(), dense.tolist(), strict=True))
    assert len(pairs) == len({b for b, _ in pairs}) == len({d for _, d in pairs}) and dense.max(initial=-1) < n


def test_the_sessions_plan_is_what_the_run_sends() -> None:
    """The shipped sessions scenario's plan: a group per user, each turn's prompt the system
    prompt then the session's context and every message and answer before it, the think times of
    the run's own draw (SessionsConfig.shape) between turns."""
    sc = scenario.load(ROOT / "scenarios" / "multi-turn-sessions.toml")
    w: Any = sc.workload
    d = figures_of("sessions").demand(sc)  # type: ignore[attr-defined]
    shapes = w.shape(w.seed_of(sc))
    assert len(d.parts) == sum(len(m) for m, _ in shapes) and d.slots is None
    assert d.first.count(True) == w.users
    messages, waits = shapes[1]
    k0 = len(shapes[0][0])  # user 1's turns follow user 0's
    for k in range(len(messages)):
        shared, own = d.parts[k0 + k]
        assert shared == ("shared", w.system_prompt_tokens) and own[0] == "session 1"
        assert own[1] == w.user_context_tokens + sum(messages[: k + 1]) + k * w.answer_tokens
        assert d.ready_s[k0 + k] == (w.starts(w.seed_of(sc))[1] if k == 0 else waits[k - 1])
    assert set(d.output_tokens) == {w.answer_tokens}


SESSIONS = """
name = "plan"
[endpoint]
api = "chat"
[workload]
kind = "sessions"
users = {users}
turns = 2
think_s = 0.5
user_context_tokens = 64
message_tokens = 32
answer_tokens = 16
{more}
"""
G1 = '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1MB"'


def sizing(tmp_path: Path, extra: str = "") -> Path:
    """test_size_command's hand-worked fleet (one worker, prefill 0.001 s a token, decode 0.01 s)
    with a G1 that holds everything, sizing the plan of tmp_path/plan.toml."""
    f = sizing_file(tmp_path, G1, extra)
    f.write_text(f.read_text().replace('trace = "t.jsonl"', 'scenario = "plan.toml"'))
    return f


def sized(tmp_path: Path, sessions: str, extra: str = "") -> dict[str, Any]:
    write_scenario(tmp_path / "plan.toml", sessions)
    sizing(tmp_path, extra)
    r = kvbench("size", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/*/sizing.json")]
    return doc


def rows(tmp_path: Path) -> Any:
    import pandas as pd

    (f,) = (tmp_path / "out").glob("*/*/requests.csv.gz")
    return pd.read_csv(f)


def test_a_session_sized_from_its_plan_worked_by_hand(tmp_path: Path) -> None:
    """One user, two turns, on one worker whose G1 holds everything. Turn 1: 64 + 32 = 96 tokens,
    nothing cached: TTFT 0.096 s, then the 15 tokens after the first at 0.01 s: it ends at 0.246 s.
    Turn 2 arrives 0.5 s later (0.746 s) with 96 + 16 + 32 = 144 tokens, of which turn 1's 6 blocks (96 tokens)
    are in G1: TTFT 0.048 s (0.144 s recomputing). The first pass's guess is already right."""
    doc = sized(tmp_path, SESSIONS.format(users=1, more=""))
    assert doc["scenario"]["kind"] == "sessions" and doc["scenario"]["requests"] == 2
    f = doc["configurations"][0]["figures"]
    assert f["prompt_tokens"] == 96 + 144 and f["tiers"][0]["served_tokens"] == 96
    assert f["arrivals"]["cached"] == {"settled": True, "passes": 1, "last_change_s": 0.0}
    r = rows(tmp_path)
    assert r["arrival_s"].tolist() == pytest.approx([0.0, 0.746])
    assert r["ttft_s"].tolist() == pytest.approx([0.096, 0.048])
    assert r["recompute_ttft_s"].tolist() == pytest.approx([0.096, 0.144])
    assert r["e2e_s"].tolist() == pytest.approx([0.246, 0.198])
    (folder,) = (tmp_path / "out").glob("*/*")
    out = kvbench("report", str(folder), "--output", str(tmp_path / "r.html"))
    assert out.returncode == 0, out.stderr
    assert "the plan of a sessions scenario, not run" in (tmp_path / "r.html").read_text()


def test_sessions_one_at_a_time_wait_for_the_one_before_worked_by_hand(tmp_path: Path) -> None:
    """Two users, `max_active = 1`: user 1's first turn waits for user 0's last to end (0.746 +
    0.048 + 0.15 = 0.944 s with G1; recomputing, 0.746 + 0.144 + 0.15 = 1.04 s), and the two
    share nothing. Recomputing, the arrivals are the recompute's own: the Baseline's TTFTs are
    put beside the requests they belong to. The plan's times sped up by an SLO search settle
    again: the first turns of both are then limited by the slot, not the speed."""
    doc = sized(tmp_path, SESSIONS.format(users=2, more="max_active = 1"), "[slo]\nttft_s = 0.1\nshare = 0.5\n")
    f = doc["configurations"][0]["figures"]
    assert f["tiers"][0]["served_tokens"] == 2 * 96
    r = rows(tmp_path)
    assert r["arrival_s"].tolist() == pytest.approx([0.0, 0.746, 0.944, 0.944 + 0.746])
    assert r["ttft_s"].tolist() == pytest.approx([0.096, 0.048, 0.096, 0.048])
    assert r["recompute_ttft_s"].tolist() == pytest.approx([0.096, 0.144, 0.096, 0.144])
    slo = f["slo"]
    assert slo["cached"]["within"] == 1.0 and slo["recompute"]["within"] == 0.5
    # recomputing, half of the requests (the first turns) meet 0.1 s at any speed: the highest tried
    assert slo["recompute"]["capacity_speedup"] == slo["speedup_ceiling"]
    # the rate at the capacity is the settled one, the sessions still waiting for their answers:
    # at x times the plan's speed, the last turn arrives at 0.246 + 0.198 + 0.246 + 1/x s
    x = slo["cached"]["capacity_speedup"]
    assert x == slo["speedup_ceiling"] and slo["cached"]["capacity_req_per_s"] == pytest.approx(3 / (0.69 + 1 / x))


def test_what_did_not_settle_is_told_per_configuration() -> None:
    from harness.sizing.result import unsettled

    settled = {"settled": True, "passes": 3, "last_change_s": 0.0}
    loose = {"settled": False, "passes": 16, "last_change_s": 0.25}
    slo = {"cached": {"unsettled_speedups": [2.0, 1.5]}, "recompute": {"unsettled_speedups": []}, "ttft_s": 1.0}
    configurations = [
        {"index": 0, "figures": {"arrivals": {"cached": settled, "recompute": settled}, "slo": None}},
        {"index": 1, "figures": {"arrivals": {"cached": settled, "recompute": loose}, "slo": slo}},
        {"index": 2, "figures": {"slo": None}},  # a trace's: nothing to settle
    ]
    assert unsettled(configurations) == [
        "configuration 1 (recompute): the arrivals still moved by 0.25 s after 16 passes; its figures are those of "
        "the last pass",
        "configuration 1 (cached): the SLO search's arrivals did not settle at 2x, 1.5x; the answers there are those "
        "of the last pass",
    ]


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ('kind = "sweep"\nlengths = [1000]', "kinds that can: "),
        ('kind = "open_loop"\npool = 2\nprompt_tokens = 100\nrequests = 4\nrates = "auto"', 'workload.rates: "auto"'),
    ],
)
def test_a_plan_that_cannot_be_known_without_running_it_is_refused_by_name(
    tmp_path: Path, kind: str, says: str
) -> None:
    write_scenario(tmp_path / "plan.toml", f'name = "plan"\n[workload]\n{kind}\n')
    sizing(tmp_path)
    r = kvbench("size", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert str(tmp_path / "plan.toml") in r.stderr


def test_a_scenario_that_is_not_there_or_not_right_is_named(tmp_path: Path) -> None:
    sizing(tmp_path)
    r = kvbench("size", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{tmp_path / 'plan.toml'}: no such scenario file" in r.stderr, r.stderr
    write_scenario(tmp_path / "plan.toml", 'name = "plan"\n[workload]\nkind = "sessions"\nusers = 0\n')
    r = kvbench("size", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{tmp_path / 'plan.toml'}: workload.users" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_closed_loops_plan_has_no_slo_capacity_and_validate_says_so_too(tmp_path: Path) -> None:
    write_scenario(
        tmp_path / "plan.toml",
        'name = "plan"\n[workload]\nkind = "closed_loop"\npool = 2\nprompt_tokens = 100\n'
        "requests = 4\nconcurrency = 2\n",
    )
    sizing(tmp_path, "[slo]\nttft_s = 1.0")
    for args in (
        ("size", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")),
        ("validate", str(tmp_path / "s.toml")),
    ):
        r = kvbench(*args)
        assert r.returncode == 2 and "slo.ttft_s: a closed_loop plan has no times to speed up" in r.stderr, r.stderr
    sizing(tmp_path)  # without [slo]: `kvbench validate` says what `kvbench size` will take
    r = kvbench("validate", str(tmp_path / "s.toml"))
    assert r.returncode == 0 and "the plan of a closed_loop scenario: 4 requests" in r.stdout, r.stdout + r.stderr


def test_the_shipped_sessions_sizing_gives_the_same_figures_in_one_process_or_two(tmp_path: Path) -> None:
    """scenarios/sizing/sessions.toml, four configurations of the shipped sessions scenario's plan:
    each settled, and every figure the same whether sized in one process or in two (a plan shares
    nothing between configurations; its references go to the processes once)."""
    docs = []
    for n in ("1", "2"):
        r = kvbench(
            "size", str(ROOT / "scenarios" / "sizing" / "sessions.toml"), "--out", str(tmp_path / n), "--workers", n
        )
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        (doc,) = [json.loads(p.read_text()) for p in (tmp_path / n).glob("*/*/sizing.json")]
        docs.append(doc)
    one, two = ([c["figures"] for c in d["configurations"]] for d in docs)
    assert len(one) == 4 and one == two
    assert all(f["arrivals"]["cached"]["settled"] and f["arrivals"]["recompute"]["settled"] for f in one)
    assert docs[0]["scenario"]["requests"] == 96 and docs[0]["scenario"]["kind"] == "sessions"
