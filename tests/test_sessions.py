"""`kind = "sessions"`: multi-turn conversations against the real emulator on an ephemeral port
(and llama.cpp in test_llamacpp.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.config.scenario import EmulatorCfg
from harness.emulator.profiles import get_profile
from harness.results import read_requests
from tests.conftest import cli, kvbench, write_scenario

SESSIONS = """
name = "sess"
[workload]
kind = "sessions"
users = 4
turns = {{ distribution = "uniform", min = 2, max = 4 }}
think_s = {{ distribution = "exponential", mean = 2.0 }}
system_prompt_tokens = 300
user_context_tokens = 1000
message_tokens = 40
answer_tokens = 20
{extra}
[[arms]]
name = "recompute"
cache = "bust"
[[arms]]
name = "cached"
[emulator]
time_scale = 10.0
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_each_turn_resends_the_history_and_finds_it_cached(tmp_path: Path, workers: int) -> None:
    sc = write_scenario(tmp_path / "s.toml", SESSIONS.format(extra="max_active = 2"))
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"), "--workers", str(workers), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "prompt tokens served from cache" in r.stderr
    for folder in (tmp_path / "out" / "sess").iterdir():
        recs = read_requests(folder)
        arm = folder.name.split("-", 1)[1]
        assert {x.session for x in recs} == {0, 1, 2, 3} and all(x.ok for x in recs)
        by = {(x.session, x.turn): x for x in recs}
        for (u, k), x in by.items():
            assert x.prompt_tokens == x.target_tokens  # exact, as the server counts them
            assert x.completion_tokens == 20 and x.prompt_id == f"u{u}-t{k}"
            if k == 1:
                assert x.idle_s is None
                continue
            prev = by[(u, k - 1)]
            assert x.target_tokens == prev.target_tokens + 20 + 40  # the answer and a new message
            assert x.idle_s is not None and x.idle_s >= 0 and x.start_s >= (prev.end_s() or 0)
            # intended: the turn before's end plus its think time; sent at or after it
            assert x.intended_s is not None and x.intended_s >= (prev.end_s() or 0)
            assert x.lag_s is not None and x.lag_s >= 0
            if arm == "cached":  # all sent before but the template's closing and a part block
                assert (x.cached_tokens or 0) >= prev.prompt_tokens - 32
            else:
                assert not x.cached_tokens
        summary = json.loads((folder / "run.json").read_text())["summary"]
        assert summary["schedule_lag"]["requests"] == len(recs)  # every turn was sent at a time
        if workers == 2:  # a session stays with one process
            for u in range(4):
                assert len({x.process for x in recs if x.session == u}) == 1


def test_real_history_puts_the_servers_answers_into_the_next_turn(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "s.toml", SESSIONS.format(extra='history = "real"\nmax_active = 4'))
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 0, r.stderr
    for folder in (tmp_path / "out" / "sess").iterdir():
        arm = folder.name.split("-", 1)[1]
        recs = read_requests(folder)
        by = {(x.session, x.turn): x for x in recs}
        assert len({x.session for x in recs}) == 4 and all(x.ok for x in recs)
        for (u, k), x in by.items():
            if k == 1:
                assert x.prompt_tokens == x.target_tokens
                continue
            prev = by[(u, k - 1)]
            # its length is the server's to count; the answer's visible words went into it (its
            # reasoning tokens did not), and the new message
            assert x.target_tokens is None and x.prompt_tokens is not None and prev.prompt_tokens is not None
            visible = (prev.completion_tokens or 0) - get_profile(EmulatorCfg.profile).reasoning_tokens
            assert visible > 0 and x.prompt_tokens == prev.prompt_tokens + visible + 40
            if arm == "cached":
                assert (x.cached_tokens or 0) >= prev.prompt_tokens - 32
            else:
                assert not x.cached_tokens


def test_sessions_get_a_connection_per_session_that_may_be_active() -> None:
    """The pool holds as many connections as sessions may be active at once: with one (as
    before), every turn waited for the turn in flight, and the shipped scenario's turns left up
    to 7 s late (schedule lag, model seconds)."""
    import tomllib

    from harness.config.scenario import parse

    for extra, n in (("", 4), ("max_active = 2", 2)):
        sc = parse(tomllib.loads("schema_version = 1\n" + SESSIONS.format(extra=extra)), "s.toml")
        assert sc.workload.most_connections() == n


def test_sessions_start_at_a_rate_and_keep_to_max_active(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "s.toml", SESSIONS.format(extra="start_rate = 0.5\nmax_active = 1"))
    r = kvbench("run", str(sc), "--arm", "cached", "--out", str(tmp_path / "out"), timeout=300)
    assert r.returncode == 0, r.stderr
    (folder,) = (tmp_path / "out" / "sess").iterdir()
    recs = sorted(read_requests(folder), key=lambda x: x.start_s)
    # one session at a time: a session's turns are never interleaved with another's
    order = [x.session for x in recs]
    assert len(set(order)) == 4
    # a session kept waiting for the one slot is held back, as max_concurrency holds a request
    firsts = [x for x in recs if x.turn == 1]
    assert all(x.intended_s is not None for x in firsts)
    assert any(x.held_s for x in firsts[1:])
    for u in range(4):
        turns = [x.turn for x in recs if x.session == u]
        assert turns == sorted(turns)
        first = min(i for i, s in enumerate(order) if s == u)
        last = max(i for i, s in enumerate(order) if s == u)
        assert set(order[first : last + 1]) == {u}


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("think_s = -1", "workload.think_s"),
        ('think_s = { distribution = "exponential", mean = 0 }', "workload.think_s.mean"),
        ("turns = 0", "workload.turns"),
        ("start_rate = 0", "workload.start_rate"),
        ("max_active = 0", "workload.max_active"),
        ("answer_tokens = 0", "workload.answer_tokens"),
    ],
)
def test_bad_session_keys_name_the_key(tmp_path: Path, extra: str, said: str) -> None:
    body = SESSIONS.format(extra="")
    key = extra.split(" =")[0]
    body = "\n".join(line for line in body.splitlines() if not line.startswith(key + " ")) + "\n"
    body = body.replace("[[arms]]", extra + "\n[[arms]]", 1)
    r = cli("validate", str(write_scenario(tmp_path / "s.toml", body)))
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr


def test_a_plot_of_many_turns_draws_one_in_k_and_says_so() -> None:
    """The sessions section's scatter plots draw at most about PLOT_POINTS turns a run: every
    k-th beyond, with "1 in k" in the run's label; below it, every turn as it is."""
    from harness.analysis.kinds import sessions

    n = 2 * sessions.PLOT_POINTS + 1
    drawn = sessions._series("r", np.arange(n, dtype=float), np.arange(n, dtype=float) * 2)
    assert drawn.label == "r (1 in 3)" and drawn.x == tuple(float(k) for k in range(0, n, 3))
    assert drawn.y == tuple(2.0 * k for k in range(0, n, 3))
    few = sessions._series("r", np.arange(5.0), np.arange(5.0))
    assert few.label == "r" and len(few.x) == 5
