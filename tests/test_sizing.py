"""Capacity curves in one pass (harness/sizing/stack.py): exact against a brute-force LRU at every
capacity, on the shipped traces and on generated ones with known reuse; sampled ones against the
exact ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.errors import InputError
from harness.inputs import traces
from harness.inputs.traces import TraceRequest
from harness.sizing import fleet, routing, simulate, stack, streamed, synthetic, tiers

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


@pytest.mark.slow
def test_sampled_curves_stay_near_the_exact_one_on_a_million_requests() -> None:
    """SHARDS at 1 % (the blocks referenced 100 times or more kept whole), 10^6 requests over
    10,000 shared documents of Zipf popularity (exponent 0.8), at 300 capacities from one block to
    past the whole trace: within 0.01 of the exact share everywhere (docs/sizing.md has the
    measured error by skew). The same sample streamed a chunk at a time, its heavy blocks found by
    the sketch (`kvbench trace curve --sample 0.01`), is within 0.01 of the exact curve at every
    step of its bins too, and the error it estimates of itself is of the same order."""
    refs = synthetic.shared_documents(10**6, documents=10_000, doc_blocks=32, own_blocks=2, alpha=0.8, block_tokens=512)
    exact = stack.curve(refs)
    sample = stack.curve(refs, rate=0.01)
    capacities = np.unique(np.geomspace(1, 10**8, 300).astype(np.int64))
    assert sample.rate == 0.01 and exact.rate == 1.0
    assert np.abs(sample.share(capacities) - exact.share(capacities)).max() <= 0.01
    sketch = streamed.Sketch()
    streamed.counted(synthetic.chunks(refs, 32_768), sketch)
    s = streamed.streamed(synthetic.chunks(refs, 32_768), 0.01, sketch)
    edges = stack.bin_edges()
    error = np.abs(s.curve.share(edges) - exact.share(edges)).max()
    assert s.requests == refs.requests and s.references == len(refs.blocks) and s.kept < len(refs.blocks)
    assert error <= 0.01
    assert error / 3 <= s.error <= 0.01  # measured: 0.0045 against an estimate of 0.0047 (seed 0)


def test_a_streamed_curve_is_exact_at_the_end_of_each_bin() -> None:
    """Every block kept: the streamed curve equals the exact one at every bin's end, while its
    table grows and its positions are renumbered, more than once (20,000 requests, some 230,000
    references, in chunks of 1,000 requests)."""
    refs = synthetic.shared_documents(20_000, documents=2_000, doc_blocks=16, own_blocks=3, alpha=0.9, block_tokens=16)
    exact = stack.curve(refs)
    s = streamed.streamed(synthetic.chunks(refs, 1_000), 1.0, None)
    edges = stack.bin_edges()
    assert len(refs.blocks) > 3 * streamed.MIN_POSITIONS and s.kept == s.references == len(refs.blocks)
    assert np.array_equal(s.curve.served(edges), exact.served(edges))
    assert s.curve.served(np.arange(stack.EXACT_BINS)).tolist() == exact.served(np.arange(stack.EXACT_BINS)).tolist()
    assert s.error == 0 and s.heavy_blocks == 0 and s.curve.share(10**9) == exact.share(10**9) > 0.3


def test_a_streamed_sample_is_the_stratified_sample_held_whole() -> None:
    """At a sampling rate, with a sketch wide enough to count every block exactly: the heavy blocks
    are the same, so the streamed curve is stack.curve's at every bin's end."""
    refs = synthetic.shared_documents(30_000, documents=3_000, doc_blocks=16, own_blocks=2, alpha=0.8, block_tokens=16)
    sketch = streamed.Sketch(width=1 << 24)
    streamed.counted(synthetic.chunks(refs, 4_096), sketch)
    s = streamed.streamed(synthetic.chunks(refs, 4_096), 0.05, sketch, seed=3)
    held = stack.curve(refs, 0.05, seed=3)
    edges = stack.bin_edges()
    _, counts = np.unique(refs.blocks, return_counts=True)
    assert s.heavy_blocks == np.count_nonzero(counts >= 20) > 0
    assert s.heavy_references == counts[counts >= 20].sum()
    assert s.curve.share(edges) == pytest.approx(held.share(edges), abs=1e-12)
    assert 0 < s.error < 0.05


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=3000), st.integers(1, 6))
def test_the_sketch_never_counts_fewer_references_than_a_block_has(blocks: list[int], width_bits: int) -> None:
    """However many blocks share its few counters, a count-min sketch with conservative update
    gives each block at least its references, and exactly them where nothing collides."""
    ids = np.array(blocks, dtype=np.int64)
    narrow, wide = streamed.Sketch(rows=3, width=1 << width_bits), streamed.Sketch(rows=3, width=1 << 20)
    for sketch in (narrow, wide):
        sketch.add(ids[: len(ids) // 2])
        sketch.add(ids[len(ids) // 2 :])
    distinct, counts = np.unique(ids, return_counts=True)
    assert np.all(narrow.estimate(distinct) >= counts)
    assert np.all(wide.estimate(distinct) >= counts) and np.count_nonzero(wide.estimate(distinct) > counts) <= 1


def test_the_bins_cover_every_distance_once() -> None:
    """`bin_of` and `bin_edges` agree: each distance falls in the bin whose edges hold it; exact
    below EXACT_BINS, then 64 bins a doubling."""
    edges = stack.bin_edges()
    assert np.all(np.diff(edges) > 0) and edges[: stack.EXACT_BINS + 1].tolist() == list(range(stack.EXACT_BINS + 1))
    rng = np.random.default_rng(0)
    for d in [*range(300), *rng.integers(0, 2**40, 2000).tolist(), 2**50 - 1, 2**50]:
        b = stack.bin_of(int(d))
        assert edges[b] <= d < edges[b + 1], d
    assert np.all(np.diff(edges[stack.EXACT_BINS :]) / edges[stack.EXACT_BINS : -1] <= 1 / 64)


def test_a_sampling_rate_outside_0_1_is_refused() -> None:
    refs = stack.references([TraceRequest(1, 0.0, 32, 1, (1, 2))], 16)
    for rate in (0.0, 1.5, -0.1):
        with pytest.raises(InputError, match="sampling rate"):
            stack.curve(refs, rate)


def brute_force_tiers(
    requests: list[TraceRequest], block_tokens: int, fleet: tiers.Fleet, layout: list[tuple[str, int]]
) -> list[int]:
    """Inclusive write-through LRU tiers simulated one block at a time: tokens served by each tier
    (fastest first), then the tokens computed. Requests round-robin over the workers."""
    from collections import OrderedDict

    caches: dict[tuple[int, int], OrderedDict[int, None]] = {}
    served = [0] * (len(layout) + 1)
    for i, r in enumerate(sorted(requests, key=lambda r: r.timestamp_s)):
        worker = i % fleet.workers
        mine = [
            caches.setdefault((k, int(fleet.group(np.array([worker]), scope)[0])), OrderedDict())
            for k, (scope, _) in enumerate(layout)
        ]
        whole = [True] * len(layout)
        usable = min(len(r.hash_ids), (r.input_length - 1) // block_tokens)
        got = 0
        for j, h in enumerate(r.hash_ids[: min(len(r.hash_ids), r.input_length // block_tokens)]):
            for k, cache in enumerate(mine):
                whole[k] = whole[k] and h in cache
                if h in cache:
                    cache.move_to_end(h)
                else:
                    cache[h] = None
                    if len(cache) > layout[k][1]:
                        cache.popitem(last=False)
            if j < usable:
                k = next((k for k, ok in enumerate(whole) if ok), len(layout))
                if k < len(layout):
                    served[k] += block_tokens
                    got += block_tokens
        served[-1] += r.input_length - got
    return served


@pytest.mark.parametrize(
    "layout",
    [
        [("worker", 6), ("node", 20), ("cluster", 60)],
        [("worker", 3), ("cluster", 25)],
        [("node", 40), ("worker", 10)],  # a slower tier smaller than a faster one's scope
    ],
)
def test_tiers_from_scoped_distances_match_a_block_by_block_simulation(layout: list[tuple[str, int]]) -> None:
    """Four workers, two a node, round robin; per-worker, per-node and cluster tiers: the tokens
    each tier serves, and those computed, equal a simulation of the tiers' LRUs block by block."""
    rng = np.random.default_rng(3)
    requests = []
    for i in range(500):
        doc = int(rng.integers(0, 15))
        ids = [doc * 100 + k for k in range(int(rng.integers(1, 8)))] + [10_000 + i]
        requests.append(TraceRequest(i + 1, float(i), len(ids) * 16 - int(rng.integers(0, 16)), 5, tuple(ids)))
    four = tiers.Fleet(workers=4, workers_per_node=2)
    refs = stack.references(requests, 16)
    worker = routing.round_robin(refs.requests, four.workers)[refs.request]
    distances = [tiers.scoped_distances(refs, four.group(worker, scope)) for scope, _ in layout]
    chosen = tiers.served_by(distances, [c for _, c in layout])
    got = tiers.tokens_by_tier(refs, chosen, len(layout))
    assert got.tolist() == brute_force_tiers(requests, 16, four, layout)
    assert got.sum() == refs.prompt_tokens


def brute_force_evictions(requests: list[TraceRequest], block_tokens: int, workers: int, above: list[int]) -> list[int]:
    """Per request, the tokens of the blocks it evicts from the last of its worker's write-through
    LRU tiers (`above`: their capacities in blocks, fastest first) that the next tier does not
    hold, that tier taking only what the one above it evicts and never evicting (as the Dynamo
    mocker's host memory, large enough): simulated one block at a time, round robin."""
    from collections import OrderedDict

    lrus: list[list[OrderedDict[int, None]]] = [[OrderedDict() for _ in above] for _ in range(workers)]
    fed: list[set[int]] = [set() for _ in range(workers)]
    copied = []
    for i, r in enumerate(sorted(requests, key=lambda r: r.timestamp_s)):
        mine, held, tokens = lrus[i % workers], fed[i % workers], 0
        for h in r.hash_ids[: r.input_length // block_tokens]:
            for cache, capacity in zip(mine, above, strict=True):
                if h in cache:
                    cache.move_to_end(h)
                    continue
                cache[h] = None
                if len(cache) > capacity:
                    evicted, _ = cache.popitem(last=False)
                    if cache is mine[-1] and evicted not in held:
                        held.add(evicted)
                        tokens += block_tokens
        copied.append(tokens)
    return copied


@pytest.mark.parametrize(
    ("workers", "above"), [(1, [12]), (3, [6]), (2, [1]), (2, [0]), (2, [3, 9]), (1, [8, 5]), (3, [2, 2])]
)
def test_what_a_tier_taking_evicted_blocks_must_copy_matches_a_block_by_block_simulation(
    workers: int, above: list[int]
) -> None:
    """`writes = "evicted"`: per request, the tokens of the blocks its references push out of the
    tier above (its worker's G1, or below a G1 its G2) that the tier taking them (per worker,
    holding all) did not have, from the stack distances and one LRU pass, equal a simulation of
    the mocker's way block by block (that tier fed by the evictions of the one above); compiled
    and as plain Python. The trace's block ids are prefix chains, as a server's hashes are."""
    capacity, k = above[-1], len(above)
    rng = np.random.default_rng(workers * 10 + sum(above))
    requests = []
    for i in range(400):
        doc = int(rng.integers(0, 12))
        ids = [doc * 100 + k for k in range(int(rng.integers(1, 9)))] + [10_000 + i]
        requests.append(TraceRequest(i + 1, float(i), len(ids) * 16 - int(rng.integers(0, 16)), 5, tuple(ids)))
    fleet_ = tiers.Fleet(workers=workers, workers_per_node=1)
    refs = stack.references(requests, 16)
    worker = routing.round_robin(refs.requests, workers)
    distances = [tiers.scoped_distances(refs, worker[refs.request])] * (k + 1)
    tier = tiers.served_by(distances, [*above, 10**6])
    got = tiers.tokens_evicted(refs, fleet_.group(worker, "worker"), tier, capacity, k, 16)
    expected = brute_force_evictions(requests, 16, workers, above)
    assert got.tolist() == expected and sum(expected) > 0
    if workers == 1:  # one stream, in time order: the pass as plain Python
        dense, n_keys = refs.dense
        plain = tiers.evicted_tally(
            dense, n_keys, refs.request, tier, np.zeros(len(tier), dtype=np.int16), capacity, k, 16, refs.requests
        )
        assert np.array_equal(plain, got)


def one_tier_requests(arrivals: list[float], workers: list[int], loaded: list[int], prompt: int = 1000) -> Any:
    n = len(arrivals)
    return simulate.Requests(
        arrival_s=np.asarray(arrivals),
        worker=np.asarray(workers),
        prompt_tokens=np.full(n, prompt),
        output_tokens=np.full(n, 10),
        tier_tokens=np.asarray(loaded).reshape(n, 1),
        instance=np.zeros((n, 1), dtype=np.int64),
    )


COST = simulate.Cost(prefill_a=1e-4, prefill_b=1e-8, decode_s=0.01)


def test_a_lone_request_takes_its_prefill_and_its_decode() -> None:
    """Nothing cached, nothing waiting: TTFT is the prefill a*n + b*n^2, e2e adds the decode of
    the 9 output tokens after the first (the prefill gives the first)."""
    got = simulate.simulate(one_tier_requests([0.0, 100.0], [0, 0], [0, 0]), [simulate.Tier(0.0, 1.0)], 1.0, COST)
    assert got.ttft_s.tolist() == pytest.approx([0.1 + 0.01] * 2)
    assert got.e2e_s.tolist() == pytest.approx([0.11 + 0.09] * 2)
    assert got.load_s.tolist() == [0.0, 0.0]


def test_a_worker_serves_one_request_at_a_time_in_arrival_order() -> None:
    """Three requests at once on one worker, a fourth on another: each waits for those before it
    on its worker, the other worker's is not held up."""
    reqs = one_tier_requests([0.0, 0.0, 0.0, 0.0], [0, 0, 0, 1], [0, 0, 0, 0])
    got = simulate.simulate(reqs, [simulate.Tier(0.0, 1.0)], 1.0, COST)
    assert got.ttft_s.tolist() == pytest.approx([0.11, 0.22, 0.33, 0.11])
    assert got.start_s.tolist() == pytest.approx([0.0, 0.11, 0.22, 0.0])


def test_a_shared_tier_divides_its_bandwidth_among_the_loads_it_serves() -> None:
    """Processor sharing, worked by hand: bandwidth 1,000 bytes/s, latency 0.5 s. A load of 2,000
    bytes from t = 0.5 runs alone until a load of 500 bytes joins at 1.5 (1,000 bytes done); both
    then get 500 bytes/s: the second ends at 2.5, the first has 500 left and ends alone at 3.0."""
    reqs = one_tier_requests([0.0, 1.0], [0, 1], [2000, 500], prompt=4000)
    got = simulate.simulate(reqs, [simulate.Tier(0.5, 1000.0)], 1.0, COST)
    assert got.load_s.tolist() == pytest.approx([3.0, 1.5])
    cached = [COST.prefill_s(4000, 2000), COST.prefill_s(4000, 500)]
    assert got.ttft_s.tolist() == pytest.approx([3.0 + cached[0], 1.5 + cached[1]])
    loads = got.loads[0]
    assert sorted(loads[:, 2].tolist()) == pytest.approx([2.5, 3.0]) and loads[:, 3].sum() == 2500
    per_second = got.read_bandwidth(0, 0.5)
    assert per_second.sum() * 0.5 == pytest.approx(2500)  # every byte counted once
    assert per_second.max() == pytest.approx(1000.0)  # never more than the tier gives


@pytest.mark.parametrize("seed", range(5))
def test_a_tiers_read_bandwidth_is_each_stretchs_bytes_in_the_bins_it_spans(seed: int) -> None:
    """Stretches of delivery (start, end, bytes/s), some spanning many bins, some instants
    (t, t, bytes), binned at once: each bin gets what a stretch-by-stretch, bin-by-bin sum gives
    (worked here the slow way), and every byte is counted once."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0, 20, 300)
    ends = np.where(rng.random(300) < 0.2, starts, starts + rng.exponential(1.5, 300))
    rates = rng.uniform(1e6, 1e11, 300)
    stretches = np.stack([starts, ends, rates], axis=1)
    bin_s = 0.25
    slow = np.zeros(int(ends.max() // bin_s) + 1)
    for a, b, rate in stretches:
        if b <= a:
            slow[int(a // bin_s)] += rate
            continue
        for k in range(int(a // bin_s), int(b // bin_s) + 1):
            slow[k] += rate * max(0.0, min(b, (k + 1) * bin_s) - max(a, k * bin_s))
    got = simulate.Result(*(np.zeros(0),) * 5, loads=[], delivered=[stretches]).read_bandwidth(0, bin_s)
    assert got == pytest.approx(slow / bin_s, rel=1e-12)
    whole = np.where(ends > starts, rates * (ends - starts), rates).sum()
    assert got.sum() * bin_s == pytest.approx(whole, rel=1e-12)
    # taken a few rows at a time (a stretch whose rows pass the bound alone goes alone): the same
    for rows in (1, 7, 100):
        assert simulate.binned(stretches, bin_s, rows) == pytest.approx(got, rel=1e-12)


@given(st.floats(min_value=1e-3, max_value=1e12), st.floats(min_value=1e-6, max_value=1e3))
def test_bandwidth_bins_are_those_asked_for_unless_too_many_then_the_fewest_whole_multiples(
    last_s: float, bin_s: float
) -> None:
    used = simulate.bin_for(last_s, bin_s)
    multiple = round(used / bin_s)
    assert used == pytest.approx(multiple * bin_s) and multiple >= 1
    assert last_s // used <= simulate.MAX_BINS  # (bins from 0 to last_s: at most MAX_BINS + 1)
    assert multiple == 1 or last_s > (multiple - 1) * bin_s * simulate.MAX_BINS * (1 - 1e-12)  # none narrower does


def test_separate_instances_do_not_share_bandwidth_and_a_free_tier_costs_nothing() -> None:
    """Two per-worker instances each serve one load at full bandwidth; a tier without a bandwidth
    (a GPU's own memory) loads at once; a request reads its tiers fastest first."""
    reqs = simulate.Requests(
        arrival_s=np.zeros(2),
        worker=np.asarray([0, 1]),
        prompt_tokens=np.full(2, 3000),
        output_tokens=np.zeros(2, dtype=np.int64),
        tier_tokens=np.asarray([[500, 1000], [500, 1000]]),
        instance=np.asarray([[0, 0], [1, 1]]),
    )
    tiers_ = [simulate.Tier(0.0, None), simulate.Tier(0.25, 1000.0)]
    got = simulate.simulate(reqs, tiers_, 1.0, COST)
    assert got.load_s.tolist() == pytest.approx([1.25, 1.25])
    assert got.ttft_s.tolist() == pytest.approx([1.25 + COST.prefill_s(3000, 1500)] * 2)


def test_writes_that_share_a_tier_slow_its_loads_and_wait_for_nobody() -> None:
    """A shared tier of 1,000 bytes/s (a byte a token). The first request computes its 3,000
    tokens and writes the 2,000 the tier did not hold once its prefill ends, at t0; the second
    arrives then on another worker and loads 1,000 tokens from the tier. Written behind, the load
    takes 1 s. Sharing the tier's bandwidth, each transfer gets 500 bytes/s: the load takes 2 s,
    then the write's last 1,000 bytes 1 s alone; the first request's own times do not change."""
    t0 = COST.prefill_s(3000, 0)
    reqs = simulate.Requests(
        arrival_s=np.asarray([0.0, t0]),
        worker=np.asarray([0, 1]),
        prompt_tokens=np.full(2, 3000),
        output_tokens=np.full(2, 10),
        tier_tokens=np.asarray([[0], [1000]]),
        instance=np.zeros((2, 1), dtype=np.int64),
        written=np.asarray([[2000], [0]]),
    )
    behind = simulate.simulate(reqs, [simulate.Tier(0.0, 1000.0)], 1.0, COST)
    shared = simulate.simulate(reqs, [simulate.Tier(0.0, 1000.0, writes="shared")], 1.0, COST)
    assert behind.load_s.tolist() == pytest.approx([0.0, 1.0]) and behind.wrote is None
    assert shared.load_s.tolist() == pytest.approx([0.0, 2.0])
    assert shared.ttft_s[0] == pytest.approx(behind.ttft_s[0]) == pytest.approx(t0)
    assert shared.wrote is not None
    (row,) = shared.wrote[0].tolist()
    assert row == pytest.approx([0, t0, t0 + 3.0, 2000.0])
    # the load's bytes, spread over its 2 s, are the tier's reads; the write's, over its 3 s
    assert shared.read_bandwidth(0, 1.0).sum() == pytest.approx(1000.0)
    assert (shared.read_bandwidth(0, 1.0) <= 500.0 + 1e-9).all()


def test_a_request_waits_for_the_copy_of_what_it_evicts_which_shares_the_tier_with_loads() -> None:
    """A G2 of 1,000 bytes/s (a byte a token) for the cluster, taking what G1 evicts. The first
    request computes its 3,000 tokens; the second, queued behind it on worker 0, evicts 2,000
    tokens G2 lacks and loads 1,000 from it; the third arrives on worker 1 when the first is done
    and loads 1,000. From then the copy and the third's load share G2 at 500 bytes/s: the load
    ends 2 s later, the copy 1 s after that, alone; then the second's own load takes 1 s."""
    t0 = COST.prefill_s(3000, 0)
    reqs = simulate.Requests(
        arrival_s=np.asarray([0.0, 0.0, t0]),
        worker=np.asarray([0, 0, 1]),
        prompt_tokens=np.full(3, 3000),
        output_tokens=np.full(3, 10),
        tier_tokens=np.asarray([[0, 0], [0, 1000], [0, 1000]]),
        instance=np.asarray([[0, 0], [0, 0], [1, 0]]),
        written=np.asarray([[3000, 0], [0, 2000], [0, 0]]),
    )
    got = simulate.simulate(reqs, [simulate.Tier(0.0, None), simulate.Tier(0.0, 1000.0, writes="evicted")], 1.0, COST)
    assert got.start_s.tolist() == pytest.approx([0.0, t0, t0])
    assert got.copy_s.tolist() == pytest.approx([0.0, 3.0, 0.0])
    assert got.load_s.tolist() == pytest.approx([0.0, 1.0, 2.0])
    assert got.ttft_s[1] == pytest.approx(t0 + 4.0 + COST.prefill_s(3000, 1000))
    assert got.wrote is not None and not len(got.wrote[0])  # (G1's writes go behind)
    (row,) = got.wrote[1].tolist()
    assert row == pytest.approx([0, t0, t0 + 3.0, 2000.0])
    # G2's reads: the two loads' 2,000 bytes, never above the 500 bytes/s they had while shared
    # (1 s bins: the shared stretch starts within a bin, so no bin is whole at 1,000 bytes/s)
    assert got.read_bandwidth(1, 1.0).sum() == pytest.approx(2000.0)
    # behind, the same requests copy nothing: the two loads share G2 from t0, 2 s each
    behind = simulate.simulate(reqs, [simulate.Tier(0.0, None), simulate.Tier(0.0, 1000.0)], 1.0, COST)
    assert behind.copy_s.tolist() == [0.0, 0.0, 0.0] and behind.load_s.tolist() == pytest.approx([0.0, 2.0, 2.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_compiled_event_loop_gives_what_it_gives_as_python(seed: int) -> None:
    """The timing's event loop compiled by numba and run as plain Python, on a fleet of 8 workers,
    4 a node, with arrivals that tie, a free G1, a G2 per node taking what G1 evicts (its requests
    wait for the copies) and a shared G4 whose writes share its bandwidth: every request's times,
    every load, write and stretch delivered, identical (the hand-worked cases above check what
    they are)."""
    rng = np.random.default_rng(seed)
    n = 400
    worker = rng.integers(0, 8, n)
    prompt = rng.integers(100, 5000, n)
    cached = (rng.random(n) < 0.8) * rng.integers(0, prompt)
    split = rng.dirichlet([1, 1, 1], n)
    reqs = simulate.Requests(
        arrival_s=np.sort(np.round(rng.exponential(0.05, n).cumsum(), 2)),
        worker=worker,
        prompt_tokens=prompt,
        output_tokens=rng.integers(1, 300, n),
        tier_tokens=(split * cached[:, None]).astype(np.int64),
        instance=np.stack([worker, worker // 4, np.zeros(n, dtype=np.int64)], axis=1),
        written=(rng.random((n, 3)) < 0.5) * rng.integers(0, 3000, (n, 3)),
    )
    timing = [
        simulate.Tier(0.0, None),
        simulate.Tier(0.001, 5e9, writes="evicted"),
        simulate.Tier(0.002, 2e10, writes="shared"),
    ]
    compiled = simulate.simulate(reqs, timing, 73728.0, COST)
    plain = simulate.run(simulate.event_loop, reqs, timing, 73728.0, COST)
    assert (compiled.copy_s > 0).any()
    for f in ("start_s", "copy_s", "load_s", "prefill_s", "ttft_s", "e2e_s"):
        assert np.array_equal(getattr(compiled, f), getattr(plain, f)), f
    for k in range(3):
        assert np.array_equal(compiled.loads[k], plain.loads[k]) and len(compiled.loads[k])
        assert np.array_equal(compiled.delivered[k], plain.delivered[k])
    assert compiled.wrote is not None and plain.wrote is not None and not len(compiled.wrote[0])
    for k in (1, 2):
        assert np.array_equal(compiled.wrote[k], plain.wrote[k]) and len(compiled.wrote[k])
    assert (compiled.ttft_s >= compiled.prefill_s - 1e-9).all() and (compiled.start_s > reqs.arrival_s).any()  # queued
    # the SLO capacity search's runs, without loads or stretches: the same times
    bare = simulate.run(simulate.compiled_event_loop(), reqs, timing, 73728.0, COST, loads=False)
    for f in ("start_s", "copy_s", "load_s", "prefill_s", "ttft_s", "e2e_s"):
        assert np.array_equal(getattr(compiled, f), getattr(bare, f)), f
    assert not any(len(x) for x in (*bare.loads, *bare.delivered))
    # and stopped by a miss budget as soon as the answer is certain: the same answer as the whole
    # run's, compiled or as Python, with every request done by then timed as in the whole run
    for ttft_s in np.quantile(compiled.ttft_s, [0.05, 0.5, 0.9, 0.99]):
        for share in (0.0, 0.5, 0.9, 0.95, 1.0):
            expected = float(np.mean(compiled.ttft_s <= ttft_s)) >= share
            assert simulate.holds(reqs, timing, 73728.0, COST, float(ttft_s), share) == expected, (ttft_s, share)
            allowed = simulate.miss_budget(n, share)
            stopped = simulate.run(simulate.event_loop, reqs, timing, 73728.0, COST, False, (float(ttft_s), allowed))
            assert stopped.slo_held == expected
            done = stopped.ttft_s > 0
            assert np.array_equal(stopped.ttft_s[done], compiled.ttft_s[done])
            met, missed = int(np.sum(stopped.ttft_s[done] <= ttft_s)), int(np.sum(stopped.ttft_s[done] > ttft_s))
            # it stopped at the request that decided it (where all may miss, the first): one fewer
            # would not have
            decided = met == n - allowed or (allowed == n and met + missed == 1)
            assert (decided and missed <= allowed) if expected else (missed == allowed + 1), (met, missed, allowed)


def test_the_miss_budget_is_the_most_misses_the_share_allows_as_it_is_computed() -> None:
    for n in (1, 2, 3, 7, 10, 99, 100, 1000, 12345):
        for share in (0.0, 0.1, 0.3, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0):
            m = simulate.miss_budget(n, share)
            assert (n - m) / n >= share and (m == n or (n - m - 1) / n < share), (n, share, m)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_compiled_tallies_give_what_they_give_as_python_and_what_numpy_counts(seed: int) -> None:
    """The per-request tokens of each tier and a curve's tallies (tiers.py), compiled and as plain
    Python, against the same counts made with numpy's masks."""
    rng = np.random.default_rng(seed)
    refs = synthetic.shared_documents(300, 15, 8, 2, 1.0, 16, seed=seed)
    n, t = len(refs.serves), 3
    distances = [np.where(rng.random(n) < 0.2, np.inf, rng.integers(0, 60, n).astype(np.float64)) for _ in range(t)]
    caps = [7, 20, 45]
    tier = tiers.served_by(distances, caps)
    expected = np.zeros((refs.requests, t), dtype=np.int64)
    for k in range(t):
        expected[:, k] = np.bincount(refs.request[tier == k], weights=refs.serves[tier == k], minlength=refs.requests)
    got = tiers.tokens_per_request(refs, tier, t)
    assert np.array_equal(got, expected)
    assert np.array_equal(tiers.tier_tally(tier, refs.request, refs.serves, refs.requests, t), expected)
    for k in range(t):  # the tokens each request writes into tier k: its references that miss it, whole blocks
        miss = distances[k] >= caps[k]
        counted = 16 * np.bincount(refs.request[miss], minlength=refs.requests)
        assert np.array_equal(tiers.tokens_written(refs, distances[k], caps[k], 16), counted)
        assert np.array_equal(tiers.written_tally(distances[k], refs.request, refs.requests, caps[k], 16), counted)
    at = np.array([3.0, 10.0, 30.0, 50.0])
    for k in range(t):
        beyond = None if k == t - 1 else np.logical_or.reduce([distances[j] < caps[j] for j in range(k + 1, t)])
        compiled = tiers.curve_tallies(distances[k], tier, refs.serves, beyond, at, k)
        plain = tiers.curve_tally(distances[k], tier, refs.serves, beyond, at, k)
        assert compiled[0] == plain[0] and all(
            np.array_equal(a, b) for a, b in zip(compiled[1:], plain[1:], strict=True)
        )
        faster, own, taken = compiled
        assert faster == refs.serves[tier < k].sum()
        first = np.searchsorted(at, distances[k], side="right")
        rest = tier >= k
        assert np.array_equal(own, np.bincount(first[rest], weights=refs.serves[rest], minlength=len(at) + 1))
        held = rest & (beyond if beyond is not None else False)
        assert np.array_equal(taken, np.bincount(first[held], weights=refs.serves[held], minlength=len(at) + 1))


def test_scoped_distances_do_not_depend_on_how_large_the_block_ids_are() -> None:
    """Block ids that are 63-bit hashes give the distances small ids give (no key overflows)."""
    requests = [TraceRequest(i + 1, float(i), 48, 1, (i % 5, 100 + i % 7, 1000 + i)) for i in range(60)]
    huge = [
        TraceRequest(r.line, r.timestamp_s, r.input_length, 1, tuple((1 << 63) - 1 - h for h in r.hash_ids))
        for r in requests
    ]
    got = []
    for reqs in (requests, huge):
        refs = stack.references(reqs, 16)
        got.append(tiers.scoped_distances(refs, routing.round_robin(refs.requests, 3)[refs.request]))
    assert np.array_equal(got[0], got[1])


def routes(requests: list[TraceRequest], workers: int, capacity: int = 100) -> list[int]:
    refs = stack.references(requests, 16)
    arrival = np.array([r.timestamp_s for r in requests])
    tokens = np.array([r.input_length for r in requests])
    cost = simulate.Cost(0.001, 0.0, 0.01)  # prefill: 1 ms a token
    return routing.prefix(refs, arrival, tokens, workers, capacity, cost).tolist()


def test_the_prefix_router_sends_a_prompt_back_to_the_worker_that_holds_it_worked_by_hand() -> None:
    """Four 64-token prompts (4 blocks of 16) on 2 workers: A at 0 (worker 0, both free, the
    lower index), B at 0 (worker 1: nothing holds it, worker 0 is busy), C at 10 s (worker 0:
    both free again), A again at 20 s: worker 0 holds its first 48 tokens, so its prefill ends
    at 20.016 s there against 20.064 s on worker 1. Round-robin would send it to worker 1."""
    a, b, c = (1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)
    requests = [TraceRequest(i + 1, t, 64, 2, ids) for i, (t, ids) in enumerate([(0, a), (0, b), (10, c), (20, a)])]
    assert routes(requests, 2) == [0, 1, 0, 0]
    assert routing.round_robin(4, 2).tolist() == [0, 1, 0, 1]


def test_the_prefix_router_weighs_a_held_prefix_against_the_queue_before_it() -> None:
    """A at 0 goes to worker 0 (busy until 0.064 s); A again at 0.001 s: worker 0 holds 48 of
    its tokens, but its prefill would end at 0.064 + 0.016 = 0.080 s there, and at 0.001 + 0.064
    = 0.065 s on the idle worker 1: it goes there (Dynamo's router weighs load too). At 1 s,
    A a third time: both hold it, both are free, the lower index."""
    a = (1, 2, 3, 4)
    requests = [TraceRequest(i + 1, t, 64, 2, a) for i, t in enumerate([0.0, 0.001, 1.0])]
    assert routes(requests, 2) == [0, 1, 0]


def test_the_prefix_routers_cache_forgets_what_its_capacity_cannot_hold() -> None:
    """160-token prompts (10 blocks; 0.16 s of prefill): A and B at 0 on workers 0 and 1, C at
    1 s on worker 0 (both free: the lower index), A again at 1.05 s. With room for 30 blocks
    worker 0 still holds A's first 144 tokens: its prefill would end at 1.16 + 0.016 = 1.176 s
    there, 1.21 s on worker 1: worker 0. With room for 10, C pushed A out: worker 1, idle."""
    a, b, c = (tuple(range(k, k + 10)) for k in (1, 11, 21))
    timeline = [(0.0, a), (0.0, b), (1.0, c), (1.05, a)]
    requests = [TraceRequest(i + 1, t, 160, 2, ids) for i, (t, ids) in enumerate(timeline)]
    assert routes(requests, 2, capacity=30) == [0, 1, 0, 0]
    assert routes(requests, 2, capacity=10) == [0, 1, 0, 1]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_kv_router_weighs_prefill_load_less_held_blocks_against_distinct_active_blocks_worked_by_hand(
    seed: int,
) -> None:
    """Dynamo's cost in blocks of 16 tokens (prompts of 64 tokens: 4 blocks; prefills of 64 ms,
    10 ms an output token): prefill tokens of the worker and the request's, less 1 a held block,
    plus the distinct prompt blocks active there and the request's others. A at 0: both workers
    idle, cost 8 each, one drawn (x). B at 0 (160 output tokens): x 16, the other 8. A again at 1
    ms: x holds it, (64 + 64) / 16 - 4 + 4 active + 0 new (A's blocks are active there already)
    = 8, the other 16. D at 2 ms: x (65 + 64) / 16 + 4 + 4 = 16.06 (A again's one computed token
    still to prefill), the other 16 (B's output not counted): the other. A at 1 s, all but B
    ended: x 4, the other 12. So x, y, x, y, x whatever the draw."""
    a, b, d = (1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)
    timeline = [(0.0, a, 2), (0.0, b, 160), (0.001, a, 2), (0.002, d, 2), (1.0, a, 2)]
    requests = [TraceRequest(i + 1, t, 64, out, ids) for i, (t, ids, out) in enumerate(timeline)]
    refs = stack.references(requests, 16)
    arrival = np.array([r.timestamp_s for r in requests])
    tokens, out = np.array([r.input_length for r in requests]), np.array([r.output_length for r in requests])
    cost = simulate.Cost(0.001, 0.0, 0.01)
    got = routing.kv_router(refs, arrival, tokens, out, 16, 2, [(100, 1.0)], cost, seed=seed).tolist()
    x = got[0]
    assert got == [x, 1 - x, x, 1 - x, x]
    # the same seed, the same routes
    assert routing.kv_router(refs, arrival, tokens, out, 16, 2, [(100, 1.0)], cost, seed=seed).tolist() == got


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5),
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 6), st.integers(1, 40)), min_size=1, max_size=40),
    st.lists(st.integers(0, 12), max_size=2),
    st.integers(0, 3),
)
def test_the_kv_router_routes_every_request_to_a_worker_and_the_same_seed_the_same_way(
    workers: int, picks: list[tuple[int, int, int]], capacities: list[int], seed: int
) -> None:
    """Any trace of prefix-chained prompts (a document and a length each, 16-token blocks), any
    fleet, no per-worker tier or one or two (credits 1 and 0.75): every request has a worker, and
    a seed routes the same way twice."""
    requests = [
        TraceRequest(i + 1, i * 0.01, length * 16, out, tuple(doc * 100 + k for k in range(length)))
        for i, (doc, length, out) in enumerate(picks)
    ]
    refs = stack.references(requests, 16)
    arrival = np.array([r.timestamp_s for r in requests])
    tokens, out = np.array([r.input_length for r in requests]), np.array([r.output_length for r in requests])
    tiers_ = list(zip(sorted(capacities), (1.0, 0.75), strict=False))
    got = routing.kv_router(refs, arrival, tokens, out, 16, workers, tiers_, COST, seed=seed)
    assert len(got) == len(requests) and ((got >= 0) & (got < workers)).all()
    assert np.array_equal(got, routing.kv_router(refs, arrival, tokens, out, 16, workers, tiers_, COST, seed=seed))


def test_what_a_sweep_hands_its_processes_is_the_value_read_only(tmp_path: Path) -> None:
    """What a sweep's processes load from the files store (sizing/shared.py) is the value put:
    the workload's arrays as they are, its block numbering included (not sorted again), a
    Placement's distances, an empty array; read-only."""
    from harness.sizing import fleet, shared

    refs = synthetic.shared_documents(500, 20, 8, 2, 1.0, 16, seed=3)
    per = np.bincount(refs.request, minlength=500)
    w = fleet.Workload(refs, np.arange(500) * 0.1, per * 16 - 3, np.full(500, 7), 16)
    _ = refs.dense
    store = shared.Files(tmp_path)
    got = store.put(w).load()
    assert "dense" in vars(got.refs)  # numbered in the parent, given as it is
    for a, b in ((got.refs.blocks, refs.blocks), (got.refs.dense[0], refs.dense[0]), (got.arrival_s, w.arrival_s)):
        assert np.array_equal(a, b) and a.dtype == b.dtype and not a.flags.writeable
    assert (got.refs.prompt_tokens, got.refs.requests, got.block_tokens) == (refs.prompt_tokens, 500, 16)
    placed = fleet.placement(w, _plan(cluster_g4=10))
    back = store.put(placed).load()
    assert all(np.array_equal(a, b) for a, b in zip(back.distances, placed.distances, strict=True))
    assert store.put(np.zeros(0)).load().shape == (0,)


def _workload(n: int = 3_000, seed: int = 5) -> Any:
    from harness.sizing import fleet

    refs = synthetic.shared_documents(n, 60, 12, 2, 1.0, 16, seed=seed)
    per = np.bincount(refs.request, minlength=n)
    arrival = np.cumsum(np.random.default_rng(seed).exponential(0.002, n))
    return fleet.Workload(refs, arrival, per * 16 - 3, np.full(n, 5), 16)


def _plan(
    g1: int = 40, g2: int = 200, cluster_g4: int = 600, g4_bandwidth: float = 2e9, routing: str = "round_robin"
) -> Any:
    """Three tiers of every scope over 8 workers, 4 a node, with an SLO."""
    from harness.sizing import fleet

    tiers_ = (
        fleet.TierPlan("G1", "worker", g1, simulate.Tier(0.0, None)),
        fleet.TierPlan("G2", "node", g2, simulate.Tier(0.0001, 20e9)),
        fleet.TierPlan("G4", "cluster", cluster_g4, simulate.Tier(0.001, g4_bandwidth)),
    )
    cost = simulate.Cost(2e-5, 1e-9, 0.001)
    return fleet.Plan(tiers.Fleet(8, 4), tiers_, 4096.0, cost, 0.05, 0.9, 0.1, routing)


@pytest.mark.parametrize("routing_", ["round_robin", "prefix", "kv_router"])
def test_a_configuration_sized_from_a_placement_and_baseline_it_shares_is_the_one_sized_alone(routing_: str) -> None:
    """A sweep computes each Placement and Baseline once for the configurations that share their
    keys: every figure and row of a configuration sized so equals the same configuration sized
    alone, whichever configuration of the group computed them."""
    from harness.sizing import fleet

    w = _workload()
    first = _plan(routing=routing_)
    others = [_plan(cluster_g4=c, g4_bandwidth=b, routing=routing_) for c in (150, 2_400) for b in (0.5e9, 8e9)]
    others += [_plan(g2=g2, routing=routing_) for g2 in (50, 800)]
    placed, base = fleet.placement(w, first), fleet.baseline(w, first)
    for plan in others:
        assert fleet.placement_key(plan) == fleet.placement_key(first)
        assert fleet.baseline_key(plan) == fleet.baseline_key(first)
        alone, shared_ = fleet.size(w, plan), fleet.size(w, plan, placed, base)
        assert alone.figures == shared_.figures
        assert all(np.array_equal(alone.rows[k], shared_.rows[k]) for k in alone.rows)
    assert (
        fleet.placement_key(_plan(g1=80, routing=routing_)) != fleet.placement_key(first) or routing_ == "round_robin"
    )


def test_tiers_of_one_scope_share_their_distances() -> None:
    """A device and a host tier per worker (as Dynamo's G1 and G2), then a cluster's: the two
    per-worker tiers' distances are one computation, and each scope's are its own streams'; the
    cluster's are the same for every fleet and routing."""
    from harness.sizing import fleet

    w = _workload(1_500, seed=3)
    g1, g2, g4 = _plan().tiers
    plan = replace(_plan(), tiers=(g1, replace(g2, scope="worker"), g4))
    p = fleet.placement(w, plan)
    assert p.distances[0] is p.distances[1]
    for k, scope in ((0, "worker"), (2, "cluster")):
        group = plan.fleet.group(p.worker, scope)[w.refs.request]
        assert np.array_equal(p.distances[k], tiers.scoped_distances(w.refs, group))
    # a cluster's tier streams every reference whatever the fleet and routing: one computation for
    # all of them, the same as the references' own, computed afresh
    other = fleet.placement(w, replace(plan, fleet=tiers.Fleet(16, 8), routing="prefix"))
    assert other.distances[2] is p.distances[2] is w.refs.distances
    fresh = stack.References(w.refs.blocks, w.refs.request, w.refs.serves, w.refs.prompt_tokens, w.refs.requests)
    assert np.array_equal(fresh.distances, p.distances[2])
    assert np.array_equal(fresh.distances, stack.prefix_distances(w.refs.blocks, w.refs.request))


def test_each_tiers_curve_is_what_the_tiers_serve_at_each_of_its_capacities() -> None:
    """The capacity curves (one pass per tier) against their definition: at each multiple of a
    tier's capacity, the others unchanged, the tokens each reference's fastest holder serves
    (tiers.served_by), for tiers of every scope and sizes from a few blocks to more than all."""
    from harness.sizing import fleet

    w = _workload(2_000, seed=9)
    for g1, g2, g4 in ((3, 20, 90), (40, 200, 600), (10, 5, 4_000), (200, 1_000, 50)):
        plan = _plan(g1, g2, g4)
        distances = fleet.placement(w, plan).distances
        caps = [t.capacity_blocks for t in plan.tiers]
        figures = fleet.size(w, plan).figures
        for k, tier in enumerate(figures["tiers"]):
            for point in tier["curve"]["points"]:
                at = list(caps)
                at[k] = int(caps[k] * point["multiple"])
                by = tiers.served_by(distances, at)
                total = w.refs.prompt_tokens
                assert point["capacity_blocks"] == at[k]
                assert point["tier_share"] == float(w.refs.serves[by == k].sum() / total)
                assert point["share"] == float(w.refs.serves[by < 3].sum() / total)


def one_by_one(requests: list[TraceRequest], block_tokens: int) -> list[tuple[int, int, int]]:
    """Each reference as (block, request, tokens it serves), request by request in time order, by
    the rule read off each request alone: its first input_length // block_tokens ids touched, the
    first (input_length - 1) // block_tokens of them servable."""
    out = []
    for i, r in enumerate(sorted(requests, key=lambda r: r.timestamp_s)):
        usable = min(len(r.hash_ids), (r.input_length - 1) // block_tokens)
        for k, h in enumerate(r.hash_ids[: min(len(r.hash_ids), r.input_length // block_tokens)]):
            out.append((h, i, block_tokens if k < usable else 0))
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 200), st.lists(st.integers(0, 2**40), max_size=14)), max_size=12
    ),
    st.integers(1, 4),
)
def test_a_traces_columns_give_the_references_and_tenants_of_its_requests(
    lines: list[tuple[int, int, list[int]]], tenants: int
) -> None:
    """Requests (timestamps with ties) read into columns: their references are those of each
    request taken alone, in time order; and the workload `tenants` tenants replay is that of the
    requests copied by hand (tenant k's ids past every id of the trace's k times over, its times
    k/tenants of the span later), in time order."""
    requests = [TraceRequest(i + 1, float(t), n, 1, tuple(ids)) for i, (t, n, ids) in enumerate(lines)]
    refs = stack.references(requests, 16)
    assert list(zip(refs.blocks.tolist(), refs.request.tolist(), refs.serves.tolist(), strict=True)) == one_by_one(
        requests, 16
    )
    assert refs.requests == len(requests) and refs.prompt_tokens == sum(r.input_length for r in requests)
    w = fleet.from_trace(requests, 16, 2.0, tenants)
    top = max((max(r.hash_ids) for r in requests if r.hash_ids), default=-1) + 1
    span = max((r.timestamp_s for r in requests), default=0.0) - min((r.timestamp_s for r in requests), default=0.0)
    copies = [
        replace(r, timestamp_s=r.timestamp_s + k * span / tenants, hash_ids=tuple(h + k * top for h in r.hash_ids))
        for k in range(tenants if requests else 1)
        for r in requests
    ]
    ordered = sorted(copies, key=lambda r: r.timestamp_s)
    t0 = ordered[0].timestamp_s if ordered else 0.0
    assert w.arrival_s.tolist() == [(r.timestamp_s - t0) / 2.0 for r in ordered]
    assert w.prompt_tokens.tolist() == [r.input_length for r in ordered]
    got = list(zip(w.refs.blocks.tolist(), w.refs.request.tolist(), w.refs.serves.tolist(), strict=True))
    assert got == one_by_one(copies, 16)


def test_a_trace_file_read_into_columns_is_the_trace_read_whole(tmp_path: Path) -> None:
    """`kvbench size`'s reading of a trace (a line at a time into columns) and `traces.read` (every
    request an object) give the same requests, format, block size and misfits."""
    for name in ("mooncake-sample.jsonl", "bailian-sample.jsonl"):
        path = TRACES / name
        whole = traces.read(path)
        reading = traces.Reading(path)
        c = stack.TraceColumns.of(reading.requests())
        assert (reading.format, reading.block, reading.misfit_lines) == (
            whole.format,
            whole.block_tokens,
            whole.misfit_lines,
        )
        assert c.timestamp_s.tolist() == [r.timestamp_s for r in whole.requests]
        assert c.input_length.tolist() == [r.input_length for r in whole.requests]
        assert c.ids.tolist() == [h for r in whole.requests for h in r.hash_ids]
