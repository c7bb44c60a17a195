"""Capacity curves in one pass (harness/sizing/stack.py): exact against a brute-force LRU at every
capacity, on the shipped traces and on generated ones with known reuse; sampled ones against the
exact ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.core.errors import InputError
from harness.inputs import traces
from harness.inputs.traces import TraceRequest
from harness.sizing import stack, synthetic

TRACES = Path(__file__).resolve().parent.parent / "scenarios" / "traces"


def every_capacity_agrees(requests: list[TraceRequest], block_tokens: int) -> None:
    """The one-pass curve gives, at every capacity from one block to more than the trace's
    distinct blocks, the tokens a brute-force LRU of that capacity serves (traces.reuse)."""
    curve = stack.curve(stack.references(requests, block_tokens))
    distinct = len({h for r in requests for h in r.hash_ids})
    for capacity in range(1, distinct + 2):
        assert curve.served(capacity) == traces.reuse(requests, block_tokens, capacity).cached_tokens, capacity
    assert curve.served(10**9) == traces.reuse(requests, block_tokens).cached_tokens


@pytest.mark.parametrize("name", ["mooncake-sample.jsonl", "bailian-sample.jsonl"])
def test_the_curve_is_exact_at_every_capacity_on_the_shipped_traces(name: str) -> None:
    trace = traces.read(TRACES / name)
    every_capacity_agrees(list(trace.requests), trace.block_tokens)


def test_the_curve_is_exact_at_every_capacity_on_generated_traces() -> None:
    """Random prefixes of shared documents, repeated ids inside a request, prompts that end inside
    a block or exactly at its end, requests with no block at all."""
    rng = np.random.default_rng(7)
    requests = []
    for i in range(400):
        doc = int(rng.integers(0, 12))
        ids = [doc * 100 + k for k in range(int(rng.integers(0, 9)))]
        ids += [10_000 + i] * int(rng.integers(0, 3)) + ([ids[0]] if ids and rng.random() < 0.1 else [])
        length = max(1, len(ids) * 16 - int(rng.integers(0, 17)))
        requests.append(TraceRequest(i + 1, float(i), length, 10, tuple(ids)))
    every_capacity_agrees(requests, 16)


def test_a_cycle_of_documents_hits_from_twice_their_count_on() -> None:
    """Known reuse: K documents of one block, each request one of them in turn and a block of its
    own. Between two reads of a document come the other K - 1 documents and K blocks of their own:
    a distance of 2K - 1, so nothing is served below 2K blocks and every repeat from 2K on."""
    k, n = 10, 200
    requests = [TraceRequest(i + 1, float(i), 32, 1, (i % k, 1000 + i)) for i in range(n)]
    curve = stack.curve(stack.references(requests, 16))
    assert curve.served(2 * k - 1) == 0
    assert curve.served(2 * k) == curve.served(10**6) == (n - k) * 16
    assert curve.share(2 * k) == pytest.approx((n - k) * 16 / (n * 32))


def test_sampled_curves_stay_near_the_exact_one_on_a_million_requests() -> None:
    """SHARDS at 1 % (the blocks referenced 100 times or more kept whole), 10^6 requests over
    10,000 shared documents of Zipf popularity (exponent 0.8), at 300 capacities from one block to
    past the whole trace: within 0.01 of the exact share everywhere (docs/sizing.md has the
    measured error by skew)."""
    refs = synthetic.shared_documents(10**6, documents=10_000, doc_blocks=32, own_blocks=2, alpha=0.8, block_tokens=512)
    exact = stack.curve(refs)
    sample = stack.curve(refs, rate=0.01)
    capacities = np.unique(np.geomspace(1, 10**8, 300).astype(np.int64))
    assert sample.rate == 0.01 and exact.rate == 1.0
    assert np.abs(sample.share(capacities) - exact.share(capacities)).max() <= 0.01


def test_a_sampling_rate_outside_0_1_is_refused() -> None:
    refs = stack.references([TraceRequest(1, 0.0, 32, 1, (1, 2))], 16)
    for rate in (0.0, 1.5, -0.1):
        with pytest.raises(InputError, match="sampling rate"):
            stack.curve(refs, rate)
