"""`[engine] timing` as the Dynamo mocker is given it (harness/engines/dynamo.py `write_profile`):
the profile's prefill times, interpolated linearly as the mocker reads them, are kvbench's cost
model within the bound its docstring gives, at every prompt length up to the model's context; its
decode time is the same everywhere on its grid; each worker is pointed at it. The live run with it
is tests/test_dynamo.py's host-tier test."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.config.engines import DYNAMO_CONTEXT, MockerTiming
from harness.engines.dynamo import Workers, write_profile

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
