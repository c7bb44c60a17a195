"""`kvbench size SIZING.toml`: the file read strictly, a hand-worked fleet through the whole
command, and the shipped example's figures adding up (the engines it wires: test_sizing.py)."""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.sizing.config import read
from harness.sizing.fleet import (
    CAPACITY_GRID,
    CAPACITY_PRECISION,
    CAPACITY_STEPS,
    capacity_step,
    slo_capacity,
    speedup,
)
from tests.conftest import ROOT, cli, kvbench

pytest.importorskip("numba")  # the sizing extra

KV = 1000  # bytes per token: the tests' own model
TWO_SAME = "\n".join(
    json.dumps({"timestamp": t, "input_length": 64, "output_length": 2, "hash_ids": [1, 2, 3, 4]})
    for t in (0, 10_000)  # ms: the second request 10 s after the first, the same 4-block prompt
)


def sizing_file(tmp_path: Path, tiers: str, extra: str = "", trace: str = TWO_SAME) -> Path:
    (tmp_path / "t.jsonl").write_text(trace + "\n")
    f = tmp_path / "s.toml"
    f.write_text(
        f"""schema_version = 1
name = "hand"
[workload]
trace = "t.jsonl"
block_tokens = 16
[model]
kv_bytes_per_token = {KV}
[cluster]
workers = 1
[engine]
prefill_a = 0.001
prefill_b = 0.0
decode_s_per_token = 0.01
{tiers}
{extra}"""
    )
    return f


def size(tmp_path: Path, f: Path) -> dict[str, Any]:
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "Simulated, not measured" in r.stderr
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/*/sizing.json")]
    assert doc["simulated"] is True and doc["kind"] == "sizing"
    return doc


def test_a_trace_whose_lengths_do_not_fit_its_hash_ids_is_warned_of(tmp_path: Path) -> None:
    """A line whose input_length is far past what its hash_ids cover at the sizing's block_tokens
    (a wrong block size, most likely): the sizing says so, and sizing.json counts such lines."""
    tier = '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 64000'
    far = json.dumps({"timestamp": 20000, "input_length": 4000, "output_length": 1, "hash_ids": [1]})
    r = kvbench("size", str(sizing_file(tmp_path, tier, trace=f"{TWO_SAME}\n{far}")), "--out", str(tmp_path / "out"))
    assert r.returncode == 0 and "warning: 1 lines' input_length is more than a block" in r.stderr.replace("\n", " ")
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/*/sizing.json")]
    assert doc["trace"]["misfit_lines"] == 1
    (tmp_path / "fit").mkdir()
    fit = size(tmp_path / "fit", sizing_file(tmp_path / "fit", tier))
    assert fit["trace"]["misfit_lines"] == 0


def test_a_prompt_seen_before_is_served_by_the_tier_that_holds_it_worked_by_hand(tmp_path: Path) -> None:
    """Two requests with the same 64-token prompt (4 blocks of 16), 10 s apart, on one worker.
    The second can be served its first 3 blocks (48 tokens: the last token is always computed):
    48 of the 128 prompt tokens. From a free G1: its TTFT is the prefill of the other 16 tokens,
    0.016 s (the first's: 0.064 s). From a G4 of 48,000 bytes/s and 0.5 s latency instead (48
    tokens x 1,000 bytes: one second to load): 0.5 + 1 + 0.016 s, at 48 KB/s while it loads."""
    g1 = size(tmp_path / "g1", sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 64000'))
    f = g1["configurations"][0]["figures"]
    assert f["prompt_tokens"] == 128 and f["tiers"][0]["served_tokens"] == 48 and f["computed_tokens"] == 80
    assert f["tiers"][0]["share"] == pytest.approx(48 / 128)
    assert f["ttft_s"]["max"] == pytest.approx(0.064) and f["ttft_s"]["p50"] == pytest.approx((0.064 + 0.016) / 2)
    assert f["recompute_ttft_s"]["max"] == pytest.approx(0.064) and f["recompute_ttft_s"]["p50"] == pytest.approx(0.064)
    assert f["prefill_gpu_s"] == pytest.approx(0.064 + 0.016) and f["recompute_prefill_gpu_s"] == pytest.approx(0.128)
    # the first request writes the 4 blocks it computes into G1 as its prefill makes them (64,000
    # bytes in 0.064 s: the last, which serves no token, written whole too); the second finds them
    # and writes nothing
    assert f["tiers"][0]["written_tokens"] == 64
    assert f["tiers"][0]["write_bytes_per_s"]["mean"] == pytest.approx(64_000 / 0.064)

    g4_tier = '[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = "64KB"\nread_bandwidth = 48000\nlatency_s = 0.5'
    g4 = size(tmp_path / "g4", sizing_file(tmp_path, g4_tier, "[slo]\nttft_s = 1.0"))
    f = g4["configurations"][0]["figures"]
    assert f["tiers"][0]["served_tokens"] == 48
    assert f["ttft_s"]["max"] == pytest.approx(0.5 + 1.0 + 0.016)
    assert f["tiers"][0]["read_bytes_per_s"]["mean"] == pytest.approx(48_000)
    # its load from 10.5 s to 11.5 s: half in each of two 1 s bins, 24,000 bytes/s each
    assert [f["tiers"][0]["read_bytes_per_s"][q] for q in ("p50", "p99", "max")] == pytest.approx([24_000] * 3)
    assert f["tiers"][0]["written_tokens"] == 64  # shared or not, the first request's blocks once
    slo = f["slo"]  # loading the prefix is slower than recomputing it here
    assert slo["cached"]["within"] == 0.5 and slo["recompute"]["within"] == 1.0


def test_the_slo_capacity_is_the_highest_speed_up_that_holds_worked_by_hand(tmp_path: Path) -> None:
    """The two requests 10 s apart, sped up x times: recomputing, the second waits for the
    first's 0.064 s prefill once they are closer than that, and its TTFT is 0.064 s plus that
    wait, within 0.1 s while 10/x >= 0.028: up to x = 357.1 (found within 2 %, from below). From a
    free G1 its TTFT is 0.016 s plus the wait, within 0.1 s at any speed: the search stops at the
    highest it tries."""
    tier = '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 64000'
    slo = size(tmp_path, sizing_file(tmp_path, tier, "[slo]\nttft_s = 0.1\nshare = 1.0"))["configurations"][0][
        "figures"
    ]["slo"]
    limit = 10 / 0.028
    assert limit / 1.02 <= slo["recompute"]["capacity_speedup"] <= limit
    assert slo["recompute"]["capacity_req_per_s"] == pytest.approx(slo["recompute"]["capacity_speedup"] * 0.1)
    assert slo["cached"]["capacity_speedup"] == 2**CAPACITY_STEPS
    assert slo["capacity_ratio"] == pytest.approx(2**CAPACITY_STEPS / slo["recompute"]["capacity_speedup"])


@given(st.floats(min_value=2.0**-14, max_value=2.0**14))
def test_the_slo_search_told_how_the_workloads_own_times_fare_does_not_simulate_them_again(limit: float) -> None:
    """The SLO capacity search, given `holds(1.0)` (the simulation at the workload's own times,
    which the sizing has run already), never asks it, and finds the same capacity as when it asks:
    the highest speed-up found to hold, within CAPACITY_PRECISION of the true limit."""
    asked: list[float] = []

    def holds(x: float) -> bool:
        asked.append(x)
        return x <= limit

    cold = slo_capacity(holds)
    assert asked[0] == 1.0
    asked.clear()
    assert slo_capacity(holds, limit >= 1.0) == cold
    assert 1.0 not in asked
    if cold is None:
        assert limit < 2.0**-CAPACITY_STEPS
    elif cold < 2**CAPACITY_STEPS:
        assert cold <= limit < cold * CAPACITY_PRECISION


def doubling_then_bisecting(holds: Callable[[float], bool]) -> float | None:
    """The SLO capacity search as it was before it took a guess: from 1x by doubling or halving,
    then bisecting by geometric means to within CAPACITY_PRECISION (the reference)."""
    up = holds(1.0)
    lo, hi = (1.0, 2.0) if up else (0.5, 1.0)
    for _ in range(CAPACITY_STEPS):
        if up and holds(hi):
            lo, hi = hi, hi * 2
        elif not up and not holds(lo):
            lo, hi = lo / 2, lo
        else:
            break
    else:
        return lo if up else None
    while hi / lo > CAPACITY_PRECISION:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


@given(
    st.one_of(st.floats(min_value=2.0**-14, max_value=2.0**14), st.integers(-800, 800).map(speedup)),
    st.one_of(st.none(), st.integers(-900, 900)),
)
def test_the_slo_search_finds_what_doubling_and_bisecting_finds_from_any_guess(limit: float, guess: int | None) -> None:
    """Started from any guess (a sweep's round-robin plans guess from their last eighth), the
    search gives the very float the search by doubling and bisecting gives, each speed-up asked
    once; told the answer's step as its guess, it asks two runs past 1x."""
    asked: list[float] = []

    def holds(x: float) -> bool:
        asked.append(x)
        return x <= limit

    assert slo_capacity(holds, None, guess) == doubling_then_bisecting(lambda x: x <= limit)
    assert len(asked) == len(set(asked))
    answer = capacity_step(holds)
    if answer is not None and 0 < answer < CAPACITY_STEPS * CAPACITY_GRID:
        asked.clear()
        assert capacity_step(holds, True, answer) == answer and len(asked) == 2


def test_a_tier_too_small_for_a_prompt_serves_none_of_it_and_its_curve_says_where_it_would(tmp_path: Path) -> None:
    tier = '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 48000'  # 3 blocks of 16,000 bytes: not 4
    f = size(tmp_path, sizing_file(tmp_path, tier))["configurations"][0]["figures"]
    assert f["tiers"][0]["served_tokens"] == 0 and f["computed_tokens"] == 128
    points = f["tiers"][0]["curve"]["points"]
    assert [p["share"] for p in points] == sorted(p["share"] for p in points)  # more capacity never serves less
    assert {p["capacity_blocks"]: p["share"] for p in points}[6] == pytest.approx(48 / 128)  # twice: it fits
    # the tier's own share is flat (0) up to 3 blocks, rises at 6 and is flat after: the knee is
    # where it is flat for good (6 blocks), not the first flat stretch
    assert [p["tier_share"] for p in points] == [p["share"] for p in points]  # (the only tier)
    assert f["tiers"][0]["curve"]["knee_blocks"] == 6


def test_the_shipped_example_adds_up(tmp_path: Path) -> None:
    """scenarios/sizing/fleet.toml: tokens served by each tier plus those computed are the
    trace's prompt tokens; the cached fleet's prefill never costs more than recomputing; each
    curve rises with capacity; a shared tier's read p99 is at least its mean."""
    r = kvbench("size", str(ROOT / "scenarios" / "sizing" / "fleet.toml"), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/*/sizing.json")]
    f = doc["configurations"][0]["figures"]
    assert sum(t["served_tokens"] for t in f["tiers"]) + f["computed_tokens"] == f["prompt_tokens"]
    assert f["prefill_gpu_s"] <= f["recompute_prefill_gpu_s"]
    for t in f["tiers"]:
        shares = [p["share"] for p in t["curve"]["points"]]
        assert shares == sorted(shares)
    g4 = f["tiers"][-1]["read_bytes_per_s"]
    assert g4["p99"] >= g4["mean"] > 0
    # its G4's writes through its read bandwidth instead: the same blocks written, loads no faster
    shared = tmp_path / "shared.toml"
    text = (
        (ROOT / "scenarios" / "sizing" / "fleet.toml")
        .read_text()
        .replace("latency_s = 0.002", 'latency_s = 0.002\nwrites = "shared"')
    )
    shared.write_text(text.replace('"../traces/', f'"{ROOT / "scenarios" / "traces"}/'))
    r = kvbench("size", str(shared), "--out", str(tmp_path / "shared"))
    assert r.returncode == 0, r.stderr
    (both,) = [json.loads(p.read_text()) for p in (tmp_path / "shared").glob("*/*/sizing.json")]
    g = both["configurations"][0]["figures"]
    assert g["tiers"][-1]["written_tokens"] == f["tiers"][-1]["written_tokens"]
    assert g["ttft_s"]["p99"] >= f["ttft_s"]["p99"] and g["ttft_s"]["mean"] >= f["ttft_s"]["mean"]
    assert both["configurations"][0]["tiers"][-1]["writes"] == "shared"
    # a block is written where it misses: the fastest tier writes what it does not serve of what
    # the prompts reference; a larger, slower tier misses no more often
    g1, g4 = f["tiers"][0], f["tiers"][-1]
    assert 0 < g1["written_tokens"] + g1["served_tokens"] <= f["prompt_tokens"]
    assert 0 < g4["written_tokens"] <= g1["written_tokens"]
    assert g4["write_bytes_per_s"]["p99"] >= g4["write_bytes_per_s"]["mean"] > 0
    assert doc["engine"]["source"].startswith("emulator profile redbooks-g4")
    # G4 taking only what each G1 evicts, copied before the request that evicts it goes on: the
    # same tokens served, fewer written, and each request's TTFT its queue, copy, loads and prefill
    evicted = tmp_path / "evicted.toml"
    evicted.write_text(shared.read_text().replace('writes = "shared"', 'writes = "evicted"'))
    r = kvbench("size", str(evicted), "--out", str(tmp_path / "evicted"))
    assert r.returncode == 0, r.stderr
    (doc_e,) = [json.loads(p.read_text()) for p in (tmp_path / "evicted").glob("*/*/sizing.json")]
    e = doc_e["configurations"][0]["figures"]
    assert [t["served_tokens"] for t in e["tiers"]] == [t["served_tokens"] for t in f["tiers"]]
    assert 0 < e["tiers"][-1]["written_tokens"] < g4["written_tokens"]
    assert e["copy_s"]["max"] > 0 == f["copy_s"]["max"] and e["ttft_s"]["mean"] > f["ttft_s"]["mean"]
    (rows,) = (tmp_path / "evicted").glob("*/*/requests.csv.gz")
    frame = pd.read_csv(rows)
    parts = frame["queue_s"] + frame["copy_s"] + frame["load_s"] + frame["prefill_s"]
    assert np.allclose(parts, frame["ttft_s"], rtol=1e-6, atol=1e-9) and (frame["copy_s"] > 0).any()
    # and the report says how G4 took its writes
    r = cli("report", str(rows.parent), "-o", str(tmp_path / "e.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "e.html").read_text()
    assert "but for G4 only the blocks the tier above evicts" in html and "waits for the copy" in html


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1\ncapacitty = 2', "tiers[0].capacitty"),
        ('[[tiers]]\nname = "G1"\nscope = "rack"\ncapacity = 1', "tiers[0].scope"),
        ('[[tiers]]\nname = "G5"\nscope = "worker"\ncapacity = 1', "tiers[0].name"),
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "lots"', "tiers[0].capacity"),
        ('[[tiers]]\nname = "G1"\nscope = "worker"', "tiers[0].capacity"),
        (
            '[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = 1\n[[tiers]]\nname = "G1"\nscope = "worker"\n'
            "capacity = 1",
            "tiers[1].name",
        ),
        ('[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = 1\nread_bandwidth = "fast"', "tiers[0].read_bandwidth"),
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1\n[slo]\nttft_s = -1', "slo.ttft_s"),
        # sweeps: each value named by its place in the list
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = [1, "lots"]', "tiers[0].capacity[1]"),
        (
            '[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = 1\nread_bandwidth = ["1GB/s", 0]',
            "tiers[0].read_bandwidth[1]",
        ),
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = []', "tiers[0].capacity"),
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = [1, 1]', "tiers[0].capacity"),
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1\nwrites = "sideways"', "tiers[0].writes"),
        # a free tier's writes have no bandwidth to share
        ('[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1\nwrites = "shared"', "tiers[0].writes"),
        (
            '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1\n[[tiers]]\nname = "G2"\nscope = "worker"\n'
            'capacity = 1\nwrites = "evicted"',
            "tiers[1].writes",
        ),
        # no faster tier evicts into the first
        (
            '[[tiers]]\nname = "G2"\nscope = "worker"\ncapacity = 1\nread_bandwidth = 1e9\nwrites = "evicted"',
            "tiers[0].writes",
        ),
    ],
)
def test_a_bad_sizing_file_names_the_file_and_the_key(tmp_path: Path, change: str, key: str) -> None:
    f = sizing_file(tmp_path, change)
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{f}: {key}" in r.stderr and "Traceback" not in r.stderr, r.stderr


G4_48KB = '[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = 64000\nread_bandwidth = 48000\nlatency_s = 0.5'


def test_bandwidths_over_more_bins_than_it_keeps_are_binned_wider_and_it_says_so(tmp_path: Path) -> None:
    """The two requests 10 s apart in bins of 0.1 microsecond: some 10^8 bins, past the million
    kept, so the bins are the fewest whole multiples of it that fit, sizing.json says which, the
    terminal warns, and the figures that do not depend on the bins are those of 1 s bins."""
    f = sizing_file(tmp_path, G4_48KB)
    f.write_text(f.read_text().replace('name = "hand"\n', 'name = "hand"\nbandwidth_bin_s = 1e-7\n'))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (doc,) = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/*/sizing.json")]
    got = doc["configurations"][0]["figures"]
    assert doc["bandwidth_bin_s"] == 1e-7 and got["bandwidth_bin_s"] > 1e-7
    assert got["bandwidth_bin_s"] / 1e-7 == pytest.approx(round(got["bandwidth_bin_s"] / 1e-7))
    assert re.search(r"warning: configuration 0: its bandwidths' p99 and max are over bins of [0-9.e+-]+ s", r.stderr)
    (tmp_path / "whole").mkdir()
    whole = size(tmp_path / "whole", sizing_file(tmp_path / "whole", G4_48KB))["configurations"][0]["figures"]
    assert whole["bandwidth_bin_s"] == 1.0
    assert got["tiers"][0]["read_bytes_per_s"]["mean"] == whole["tiers"][0]["read_bytes_per_s"]["mean"] == 48_000
    assert got["ttft_s"] == whole["ttft_s"]


@pytest.mark.parametrize("plan", [False, True])
def test_arrivals_spread_past_what_the_clock_can_time_are_refused(tmp_path: Path, plan: bool) -> None:
    """A trace slowed 10^300 times, and the sessions scenario's plan slowed 10^7 times (4.02x10^9 s
    from its first request to its last before any answer adds to it)."""
    f = sizing_file(tmp_path, G4_48KB)
    text = f.read_text()
    if plan:
        text = text.replace('trace = "t.jsonl"', f'scenario = "{ROOT / "scenarios" / "multi-turn-sessions.toml"}"')
    f.write_text(text.replace("block_tokens = 16\n", f"block_tokens = 16\nrate_scale = {1e-7 if plan else 1e-300}\n"))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{f}: workload.rate_scale: expected arrivals over at most" in r.stderr, r.stderr
    assert ("they span at least" in r.stderr) == plan and "Traceback" not in r.stderr


SWEEP = """[[tiers]]
name = "G1"
scope = "worker"
capacity = [16000, 96000]
[[tiers]]
name = "G4"
scope = "cluster"
capacity = 1000000
read_bandwidth = [48000, "free", "1GB/s"]
latency_s = 0.5
[slo]
ttft_s = 0.1"""


def test_a_sweep_is_each_of_its_configurations_sized_alone_whatever_the_processes(tmp_path: Path) -> None:
    """Lists make a sweep of their product (2 G1 capacities x 3 G4 bandwidths: 6 configurations,
    in the file's order): each configuration's figures equal a file of its values alone, in one
    process or two, and configurations.csv and configurations.jsonl have a row for each."""
    (tmp_path / "sweep").mkdir()
    docs = [size(tmp_path / "sweep", sizing_file(tmp_path / "sweep", SWEEP))]
    r = kvbench("size", str(sizing_file(tmp_path, SWEEP)), "--out", str(tmp_path / "two"), "--workers", "2")
    assert r.returncode == 0, r.stderr
    docs.append(json.loads(next((tmp_path / "two").glob("*/*/sizing.json")).read_text()))
    assert docs[0]["swept"] == docs[1]["swept"] == ["G1.capacity", "G4.read_bandwidth"]
    for doc in docs:
        assert doc["status"] == "completed"
        got = [(c["swept"]["G1.capacity"], c["swept"]["G4.read_bandwidth"]) for c in doc["configurations"]]
        assert got == [(g1, bw) for g1 in (16000, 96000) for bw in (48000.0, None, 1e9)]
    assert [c["figures"] for c in docs[0]["configurations"]] == [c["figures"] for c in docs[1]["configurations"]]
    alone = SWEEP.replace("[16000, 96000]", "96000").replace('[48000, "free", "1GB/s"]', "48000")
    (tmp_path / "alone").mkdir()
    one = size(tmp_path / "alone", sizing_file(tmp_path / "alone", alone))["configurations"]
    assert len(one) == 1 and one[0]["swept"] == {} and one[0]["figures"] == docs[0]["configurations"][3]["figures"]
    folder = next((tmp_path / "sweep" / "out").glob("*/*"))
    rows = (folder / "configurations.csv").read_text().splitlines()
    assert len(rows) == 7 and rows[0].startswith("workers,G1_capacity_bytes,G1_read_bandwidth,G1_share")
    assert len((folder / "configurations.jsonl").read_text().splitlines()) == 6
    # a G1 of 1 block holds no prefix; one of 6 holds the 3 blocks the second request can be served
    shares = [c["figures"]["tiers"][0]["share"] for c in docs[0]["configurations"]]
    assert shares == [0.0] * 3 + [48 / 128] * 3


def test_a_sweep_stopped_keeps_what_it_sized_and_leaves_no_process(tmp_path: Path) -> None:
    """SIGTERM while a sweep runs in two processes, after its first configuration is done: exit
    130 at once, sizing.json `interrupted` with the configurations done (as in
    configurations.jsonl), and neither sizing process left running."""
    f = tmp_path / "fleet.toml"
    text = (ROOT / "scenarios" / "sizing" / "fleet.toml").read_text()
    bandwidths = ", ".join(f'"{n}GB/s"' for n in range(1, 65))
    f.write_text(text.replace('"../traces/', f'"{ROOT}/scenarios/traces/').replace('"10GB/s"', f"[{bandwidths}]"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "size", str(f), "--out", str(tmp_path / "out"), "--workers", "2"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("  1/64:"):
            break
    children = _children(proc.pid)
    assert len(children) >= 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 130
    proc.stderr.close()
    folder = next((tmp_path / "out").glob("*/*"))
    doc = json.loads((folder / "sizing.json").read_text())
    done = (folder / "configurations.jsonl").read_text().splitlines()
    assert doc["status"] == "interrupted" and 1 <= len(doc["configurations"]) == len(done) < 64
    # its request rows: those of the configurations done, each whole (300 requests)
    out = kvbench("export", str(folder), "--table", "requests", "-o", str(tmp_path / "r.csv"))
    assert out.returncode == 0, out.stderr
    counts = pd.read_csv(tmp_path / "r.csv")["configuration"].value_counts()
    assert sorted(counts.index) == sorted(c["index"] for c in doc["configurations"]) and set(counts) == {300}
    # the sizing processes were terminated before kvbench exited (the standard library's
    # resource tracker, a child too, ends on its own once kvbench's end of its pipe closes)
    assert not [pid for pid in children if _running(pid) and b"resource_tracker" not in _cmdline(pid)]


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(p) for p in found]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_sweep_too_large_is_refused_before_anything_runs(tmp_path: Path) -> None:
    many = SWEEP.replace("[16000, 96000]", str(list(range(1, 33)))).replace(
        '[48000, "free", "1GB/s"]', str(list(range(1, 34)))
    )
    f = sizing_file(tmp_path, many)
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "1,056 configurations; expected at most 1,024" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_tenants_scale_the_trace_up_without_sharing_across_them(tmp_path: Path) -> None:
    """`tenants = 3`: three times the requests, each tenant's second request served from its own
    first (48 tokens each, none from another tenant's), so the share served is the trace's."""
    tier = '[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = "1MB"'
    f = sizing_file(tmp_path, tier)
    f.write_text(f.read_text().replace("block_tokens = 16", "block_tokens = 16\ntenants = 3"))
    doc = size(tmp_path, f)
    got = doc["configurations"][0]["figures"]
    assert doc["tenants"] == 3 and got["requests"] == 6 and got["prompt_tokens"] == 3 * 128
    assert got["tiers"][0]["served_tokens"] == 3 * 48 and got["tiers"][0]["share"] == pytest.approx(48 / 128)


def test_the_shipped_sizing_files_validate_and_the_redbooks_one_sweeps_g4_from_50_to_400_gb_s() -> None:
    files = [ROOT / "scenarios" / "sizing-redbooks.toml", *sorted((ROOT / "scenarios" / "sizing").glob("*.toml"))]
    r = kvbench("validate", *map(str, files))
    assert r.returncode == 0 and r.stdout.count("ok (sizing file for `kvbench size`") == len(files), r.stderr
    spec = read(files[0])
    assert [c.tiers[-1].read_bandwidth for c in spec.configurations()] == [50e9, 100e9, 200e9, 400e9]
    assert [(t.name, t.scope) for t in spec.tiers] == [("G1", "worker"), ("G2", "node"), ("G4", "cluster")]


def test_a_sizing_files_mistakes_are_all_told_at_once(tmp_path: Path) -> None:
    f = sizing_file(tmp_path, '[[tiers]]\nname = "G9"\nscope = "worker"\ncapacity = 1\n[clustre]\nx = 1')
    f.write_text(f.read_text().replace("workers = 1", "workers = 0").replace("block_tokens = 16", "block_tokens = 0"))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{f}: 4 errors:" in r.stderr, r.stderr
    for key in (
        "workload.block_tokens",
        "cluster.workers",
        "tiers[0].name",
        "clustre: unknown key (did you mean 'cluster'?",
    ):
        assert f"{f}: {key}" in r.stderr, key


def test_a_sizing_file_without_tiers_is_refused(tmp_path: Path) -> None:
    f = sizing_file(tmp_path, "")
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{f}: tiers: missing; expected one or more [[tiers]] tables" in r.stderr, r.stderr


def test_an_engine_without_its_cost_or_a_profile_is_refused(tmp_path: Path) -> None:
    f = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1')
    f.write_text(f.read_text().replace("prefill_b = 0.0\n", ""))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "engine.prefill_b: missing" in r.stderr, r.stderr
    f.write_text(f.read_text().replace("prefill_a = 0.001\n", 'profile = "h100"\n'))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "engine.profile: expected one of" in r.stderr, r.stderr


def test_prefix_routing_sends_a_prompt_back_to_its_workers_g1_and_needs_one(tmp_path: Path) -> None:
    """test_sizing.py's hand-worked four requests (A, B, C, A again; 64 tokens each) on 2 workers
    with a G1 each: routed by prefix, A's second request finds its 48 tokens in worker 0's G1
    (48 of 256 prompt tokens); round-robin sends it to worker 1, which never saw it. Prefix
    routing without a per-worker tier has no cache to match, and is refused by key."""
    trace = "\n".join(
        json.dumps({"timestamp": t, "input_length": 64, "output_length": 2, "hash_ids": ids})
        for t, ids in ((0, [1, 2, 3, 4]), (0, [5, 6, 7, 8]), (10_000, [9, 10, 11, 12]), (20_000, [1, 2, 3, 4]))
    )
    g1 = '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 128000'  # 8 blocks: A and C both fit
    shares = {}
    for routing in ("round_robin", "prefix"):
        (tmp_path / routing).mkdir()
        f = sizing_file(tmp_path / routing, g1, trace=trace)
        f.write_text(f.read_text().replace("workers = 1", f'workers = 2\nrouting = "{routing}"'))
        doc = size(tmp_path / routing, f)
        assert doc["cluster"]["routing"] == routing
        shares[routing] = doc["configurations"][0]["figures"]["tiers"][0]["served_tokens"]
    assert shares == {"round_robin": 0, "prefix": 48}
    (tmp_path / "g4").mkdir()
    f = sizing_file(tmp_path / "g4", '[[tiers]]\nname = "G4"\nscope = "cluster"\ncapacity = "1MB"', trace=trace)
    f.write_text(f.read_text().replace("workers = 1", 'workers = 2\nrouting = "prefix"'))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and 'cluster.routing: expected a tier of scope = "worker"' in r.stderr, r.stderr


def test_a_sizing_report_shows_every_configuration_simulated_in_a_real_browser(tmp_path: Path, browser: str) -> None:
    """`kvbench report` on a sizing result: labelled simulated, a table row per configuration
    with its values, the capacity curves and the figures against the swept bandwidth, nothing
    loaded but the page, no error in a real browser."""
    import asyncio

    from tests.browser import assert_clean, inspect_page

    doc = size(tmp_path, sizing_file(tmp_path, SWEEP))
    folder = next((tmp_path / "out").glob("*/*"))
    r = cli("report", str(folder.parent), "-o", str(tmp_path / "s.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "s.html").read_text()
    assert (
        "Simulated results, not measured." in html and "<h3>Against G1.capacity</h3>" in html
    )  # (a bandwidth list with "free" has no axis)
    rows = [line for line in html.splitlines() if re.search(r"x (faster|slower)</td>|the same</td>", line)]
    assert len(rows) == len(doc["configurations"]) == 6
    assert rows[1].startswith('<tr><td class="l">16 KB</td><td class="l">free</td>')
    got = asyncio.run(inspect_page(browser, (tmp_path / "s.html").as_uri()))
    assert_clean(got, tmp_path / "s.html")
    assert len(got["sizes"]) == 3 and all(w > 200 and h > 100 for w, h in got["sizes"])


def test_a_sizing_report_refuses_runs_beside_it_and_a_damaged_sizing_json(tmp_path: Path) -> None:
    size(tmp_path, sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 48000'))
    folder = next((tmp_path / "out").glob("*/*"))
    run = ROOT / "tests" / "golden" / "runs" / "smoke"
    r = cli("report", str(folder), str(run), "-o", str(tmp_path / "x.html"))
    assert r.returncode == 2 and "sizing results or run results, not both" in r.stderr and str(run) in r.stderr
    doc = json.loads((folder / "sizing.json").read_text())
    for damaged in ("{", json.dumps({**doc, "kind": "run"}), json.dumps({**doc, "configurations": [{"figures": 1}]})):
        (folder / "sizing.json").write_text(damaged)
        r = cli("report", str(folder), "-o", str(tmp_path / "x.html"))
        assert r.returncode == 2 and f"{folder / 'sizing.json'}:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "x.html").exists()


def test_the_gate_checks_each_configuration_of_a_sizing(tmp_path: Path) -> None:
    """`kvbench gate` on a sizing result: a threshold per configuration (its swept values as its
    arm), exit 1 when one fails; the rules from the sizing file's [gate] or --rules; regressions
    and baselines refused (a sizing has no runs to compare), an unknown metric named."""
    rules = '[gate.thresholds]\nsized_ttft_p99_s = ["value < 0.1"]\nsized_g1_share = ["value > 0.1"]\n'
    f = sizing_file(tmp_path, SWEEP, extra=rules)
    doc = size(tmp_path, f)
    folder = next((tmp_path / "out").glob("*/*"))
    out = tmp_path / "gate.json"
    r = cli("gate", str(folder), "--json", str(out))
    verdicts = json.loads(out.read_text())["verdicts"]
    assert len(verdicts) == 2 * len(doc["configurations"]) == 12
    g1 = {v["selector"]: v["verdict"] for v in verdicts if v["metric"] == "sized_g1_share"}
    # the G1 of one block serves nothing; the one of six blocks serves 48 of 128 tokens
    assert g1["{arm=G1.capacity:16KB;G4.read_bandwidth:48KB/s}"] == "fail"
    assert g1["{arm=G1.capacity:96KB;G4.read_bandwidth:free}"] == "pass"
    assert r.returncode == 1 and "kvbench gate: hand" in r.stdout, r.stdout
    loose = tmp_path / "loose.toml"
    loose.write_text('[gate.thresholds]\nsized_ttft_p99_s = ["value < 10"]\n')
    f.write_text(f.read_text().replace(rules, ""))
    (tmp_path / "out2").mkdir()
    kvbench("size", str(f), "--out", str(tmp_path / "out2"))
    plain = next((tmp_path / "out2").glob("*/*"))
    assert cli("gate", str(plain)).returncode == 2  # no rules
    assert cli("gate", str(plain), "--rules", str(loose)).returncode == 0
    for bad, says in (
        ('[gate.regression]\nsized_ttft_p99_s = { value = "+10%" }\n', "a sizing takes thresholds only"),
        ('[gate.thresholds]\nsized_g5_share = ["value > 0"]\n', "unknown metric 'sized_g5_share'"),
    ):
        loose.write_text(bad)
        r = cli("gate", str(plain), "--rules", str(loose))
        assert r.returncode == 2 and says in r.stderr, r.stderr
    r = cli(
        "gate",
        str(plain),
        "--rules",
        str(loose),
        "--baseline",
        str(ROOT / "baselines" / "smoke.json"),
    )
    assert r.returncode == 2 and "not against a baseline" in r.stderr, r.stderr


LIVE = """
name = "live"
[endpoint]
api = "completions"
max_tokens = 2
[workload]
kind = "trace"
path = "{trace}"
[[arms]]
name = "cached"
[emulator]
profile = "tiered"
time_scale = 4.0
capacity_blocks = {{ G1 = 2000, G2 = 8000 }}
"""
# The emulator's tiered profile as a sizing file sees it: its G1 and G2 of the live run (2,000 and
# 8,000 blocks of 16 tokens at 73,728 bytes a token) and their timing, its G4 that holds
# everything at the paper-fitted bandwidth and latency, its engine's cost model
SIZED_LIVE = """
[[tiers]]
name = "G1"
scope = "worker"
capacity = 2359296000
[[tiers]]
name = "G2"
scope = "worker"
capacity = 9437184000
read_bandwidth = {g2_bw}
latency_s = {g2_latency}
[[tiers]]
name = "G4"
scope = "cluster"
capacity = "500TB"
read_bandwidth = {g4_bw}
latency_s = {g4_latency}
"""
# How far a tier's predicted share may be from the live one: measured 2.4 points at most (G1
# 45.7 % predicted against 43.3 % live, G2 20.8 % against 22.8 %, G4 0.1 % against 0.5 %; the
# emulator keeps 16-token blocks where the trace's are 512)
LIVE_TOLERANCE = 0.03
# The predicted TTFT median against the live one (the bound): measured 0.045 s against
# 0.043 s, 4 % (the p99, 0.188 s against 0.232 s, is not held to it: the live tail has the
# client's and the emulator's own delays). The emulator runs at time scale 4, not faster: a
# millisecond the busy machine adds is that many model milliseconds (at 10, 11 % under the whole
# suite; at 4, within 10 % beside two busy loops on this 2-core VM)
LIVE_TTFT_TOLERANCE = 0.10


@pytest.mark.slow
def test_predicted_tier_shares_match_the_emulators_tiered_profile_live(tmp_path: Path) -> None:
    """The shipped Mooncake sample replayed live at its timestamps against the emulator's
    `tiered` profile with a small G1 and G2, then sized with the same tiers and timing on one
    worker: the tokens served from cache are the same, each tier's share is within
    LIVE_TOLERANCE of what the emulator's own counters say it served, and the TTFT median within
    LIVE_TTFT_TOLERANCE of the one measured."""
    from harness.emulator.profiles import profiles
    from tests.conftest import arm_folders, write_scenario

    trace = ROOT / "scenarios" / "traces" / "mooncake-sample.jsonl"
    sc = write_scenario(tmp_path / "live.toml", LIVE.format(trace=trace))
    r = kvbench("run", str(sc), "--out", str(tmp_path / "runs"), timeout=600)
    assert r.returncode == 0, r.stderr
    folder = arm_folders(tmp_path / "runs", "live")["cached"]
    live = json.loads((folder / "metrics.json").read_text())["phases"]["run"]["mapped"]["tier_hit_tokens"]
    prompt = sum(json.loads(x)["prompt_tokens"] for x in (folder / "requests.jsonl").read_text().splitlines())

    g2, g4 = profiles()["tiered"].tiers[1:]
    tiers = SIZED_LIVE.format(
        g2_bw=g2.read_bytes_per_s, g2_latency=g2.latency_s, g4_bw=g4.read_bytes_per_s, g4_latency=g4.latency_s
    )
    text = sizing_file(tmp_path, tiers, trace=trace.read_text()).read_text()
    text = text.replace("block_tokens = 16\n", "").replace("kv_bytes_per_token = 1000", "kv_bytes_per_token = 73728")
    engine = text[text.index("[engine]") : text.index("[[tiers]]")]  # the emulator's cost model instead
    f = tmp_path / "s.toml"
    f.write_text(text.replace(engine, '[engine]\nprofile = "tiered"\n'))
    got = size(tmp_path, f)["configurations"][0]["figures"]
    assert got["prompt_tokens"] == prompt
    predicted = {t["name"]: t["served_tokens"] for t in got["tiers"]}
    assert sum(predicted.values()) == sum(live.values())  # what any cache could serve: the same
    for tier in ("G1", "G2", "G4"):
        assert abs(predicted[tier] - live[tier]) / prompt <= LIVE_TOLERANCE, (tier, predicted, live)
    # the live TTFTs less what the emulator says it ran late against its own model (a busy machine
    # delays it; what is compared is the model the emulator served, with the client's own time)
    records = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    measured = statistics.median(r["ttft_s"] - (r.get("emulator_late_s") or 0.0) for r in records)
    assert abs(got["ttft_s"]["p50"] / measured - 1) <= LIVE_TTFT_TOLERANCE, (got["ttft_s"], measured)


def test_export_gives_a_sizings_configurations_as_a_table(tmp_path: Path) -> None:
    """`kvbench export SIZING --table configurations`: a row per configuration, as
    configurations.csv has them, in any format; a run's folder has none (exit 2)."""
    import pandas as pd

    size(tmp_path, sizing_file(tmp_path, SWEEP))
    folder = next((tmp_path / "out").glob("*/*"))
    for fmt in ("csv", "jsonl"):
        out = tmp_path / f"c.{fmt}"
        r = cli("export", str(folder.parent), "--table", "configurations", "--format", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
        got = pd.read_csv(out) if fmt == "csv" else pd.read_json(out, lines=True)
        assert len(got) == 6 and bool(got["simulated"].all()) and set(got["sizing"]) == {"hand"}
    written = pd.read_csv(folder / "configurations.csv")
    assert got["G1_share"].tolist() == written["G1_share"].tolist()
    r = cli("export", str(ROOT / "tests" / "golden" / "runs" / "smoke"), "--table", "configurations")
    assert r.returncode == 2 and "only `kvbench size` results have them" in r.stderr, r.stderr


def test_each_requests_row_adds_up_to_its_configurations_figures(tmp_path: Path) -> None:
    """requests.csv.gz: a row per request of each configuration of a sweep sized in two
    processes; per configuration, the rows' tokens per tier and computed add up to its figures,
    and their TTFTs give its quantiles. `kvbench export --table requests` gives the same rows
    (after the sizing's name and folder, marked simulated)."""
    import numpy as np

    trace = "\n".join(
        json.dumps(
            {"timestamp": 500 * i, "input_length": 64, "output_length": 2, "hash_ids": [i % 3, 10 + i % 5, 20 + i]}
        )
        for i in range(40)
    )
    f = sizing_file(tmp_path, SWEEP, trace=trace)
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"), "--workers", "2")
    assert r.returncode == 0, r.stderr
    folder = next((tmp_path / "out").glob("*/*"))
    doc = json.loads((folder / "sizing.json").read_text())
    assert doc["requests_file"] == "requests.csv.gz"
    rows = pd.read_csv(folder / "requests.csv.gz")
    assert sorted(rows["configuration"].unique()) == list(range(6))
    for i, c in enumerate(doc["configurations"]):
        mine = rows[rows["configuration"] == i].sort_values("request")
        f_ = c["figures"]
        assert mine["request"].tolist() == list(range(40))
        for t in f_["tiers"]:
            assert int(mine[f"{t['name'].lower()}_tokens"].sum()) == t["served_tokens"]
        assert int(mine["computed_tokens"].sum()) == f_["computed_tokens"]
        assert (mine["prompt_tokens"] == mine[["g1_tokens", "g4_tokens", "computed_tokens"]].sum(axis=1)).all()
        assert np.isclose(np.percentile(mine["ttft_s"], 50), f_["ttft_s"]["p50"], rtol=1e-6)
        assert np.isclose(np.percentile(mine["recompute_ttft_s"], 99), f_["recompute_ttft_s"]["p99"], rtol=1e-6)
    out = kvbench("export", str(folder), "--table", "requests", "-o", str(tmp_path / "r.csv"))
    assert out.returncode == 0, out.stderr
    exported = pd.read_csv(tmp_path / "r.csv")
    assert len(exported) == len(rows) and set(exported["simulated"]) == {True}
    # (export types every time as a float; pandas reads a column of whole numbers, such as copy_s
    # where no tier takes evicted blocks, as integers)
    times = {c: "float64" for c in rows.columns if c.endswith("_s")}
    assert exported.drop(columns=["sizing", "folder", "simulated"]).equals(rows.astype(times))


def test_request_rows_are_left_out_when_asked_and_export_says_so(tmp_path: Path) -> None:
    r = kvbench("size", str(sizing_file(tmp_path, SWEEP)), "--out", str(tmp_path / "out"), "--no-requests")
    assert r.returncode == 0, r.stderr
    folder = next((tmp_path / "out").glob("*/*"))
    assert json.loads((folder / "sizing.json").read_text())["requests_file"] is None
    assert not (folder / "requests.csv.gz").exists()
    out = kvbench("export", str(folder), "--table", "requests")
    assert out.returncode == 2 and "no request rows" in out.stderr and "--requests" in out.stderr, out.stderr


@pytest.mark.parametrize("damage", ["endless line", "cut short", "not csv numbers", "named elsewhere"])
def test_damaged_request_rows_are_refused_by_name(tmp_path: Path, damage: str) -> None:
    """A sizing result's requests.csv.gz damaged (one line without end, decompressing for ever;
    a file cut short; text where numbers belong) or sizing.json naming another file: export
    says what is wrong with which file (exit 2), within bounded memory, and writes nothing."""
    import gzip

    r = kvbench("size", str(sizing_file(tmp_path, SWEEP)), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    folder = next((tmp_path / "out").glob("*/*"))
    rows = folder / "requests.csv.gz"
    if damage == "endless line":
        with gzip.open(rows, "wt") as f:
            for _ in range(64):
                f.write("9" * (1 << 16))  # 4 MiB, not a newline in it
    elif damage == "cut short":
        rows.write_bytes(rows.read_bytes()[:-20])
    elif damage == "not csv numbers":
        with gzip.open(rows, "wt") as f:
            f.write("configuration,request,ttft_s\n0,0,=HYPERLINK(1)\n")
    else:
        doc = json.loads((folder / "sizing.json").read_text())
        (tmp_path / "elsewhere.csv.gz").write_bytes(rows.read_bytes())
        doc["requests_file"] = "../../../elsewhere.csv.gz"
        (folder / "sizing.json").write_text(json.dumps(doc))
    out = kvbench("export", str(folder), "--table", "requests", "-o", str(tmp_path / "r.csv"))
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert ("no request rows" if damage == "named elsewhere" else "requests.csv.gz: unreadable") in out.stderr
    assert not (tmp_path / "r.csv").exists()


def result_folder(folder: Path, workload: dict[str, Any], records: list[dict[str, Any]], arm: str = "a") -> Path:
    """A result folder of one arm, as kvbench writes one: its run.json and its records."""
    run = folder / f"20261205T000000Z-{arm}"
    run.mkdir(parents=True)
    meta = {
        "schema_version": 1,
        "run_id": "20261205T000000Z",
        "scenario_name": "made",
        "arm": arm,
        "status": "completed",
        "scenario": {"workload": workload, "endpoint": {"max_tokens": 2}},
    }
    (run / "run.json").write_text(json.dumps(meta))
    base = {"arm": arm, "phase": "run", "target_tokens": None, "cached_tokens": None, "completion_tokens": 2}
    base |= {"ttft_s": 0.01, "first_byte_s": 0.01, "first_content_s": 0.01, "headers_s": 0.001, "e2e_s": 0.02}
    base |= {"itl_s": [], "ok": True, "error": None, "error_kind": None, "http_status": 200, "retried": False}
    lines = [json.dumps({**base, "id": i, **r}) for i, r in enumerate(records, 1)]
    (run / "requests.jsonl").write_text("\n".join(lines) + "\n")
    return run


def replayed(tmp_path: Path, folder: Path, extra: str = "") -> dict[str, Any]:
    """`kvbench size` of a result folder on one worker whose G1 holds everything."""
    text = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1MB"').read_text()
    f = tmp_path / "r.toml"
    f.write_text(text.replace('trace = "t.jsonl"', f'result = "{folder}"{extra}'))
    return size(tmp_path, f)


def test_a_result_folders_sessions_share_their_history_worked_by_hand(tmp_path: Path) -> None:
    """A sessions run with a 32-token system prompt, replayed in 16-token blocks: session 0's first
    turn (72 tokens: 2 system blocks, 2 of its own), session 1's (72: shares the 2 system blocks,
    32 tokens), then session 0's second turn (132 tokens): its first 4 blocks are its first
    turn's (64 tokens), the fifth reaches past what that turn held. 96 of 276 tokens served; a
    sessions run has no schedule, so its requests arrive when they were sent."""
    records = [
        {"prompt_id": "u0-t1", "session": 0, "turn": 1, "prompt_tokens": 72, "start_s": 0.0},
        {"prompt_id": "u1-t1", "session": 1, "turn": 1, "prompt_tokens": 72, "start_s": 10.0},
        {"prompt_id": "u0-t2", "session": 0, "turn": 2, "prompt_tokens": 132, "start_s": 20.0},
    ]
    folder = result_folder(tmp_path / "runs", {"kind": "sessions", "system_prompt_tokens": 32}, records)
    doc = replayed(tmp_path, folder)
    f = doc["configurations"][0]["figures"]
    assert f["requests"] == 3 and f["prompt_tokens"] == 276 and f["tiers"][0]["served_tokens"] == 96
    said = doc["result"]
    assert (said["kind"], said["arm"], said["arrivals"], said["block_tokens"]) == ("sessions", "a", "sent", 16)
    assert said["requests"] == 3 and said["left_out"] == 0
    r = cli("report", str(next((tmp_path / "out").glob("*/*"))), "-o", str(tmp_path / "x.html"))
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "x.html").read_text()
    assert f"{folder}</code> (arm a of a sessions run, 16-token blocks, arriving when they were sent)" in page


def test_a_result_folders_pool_shares_its_prefix_and_its_warm_up_nothing_worked_by_hand(tmp_path: Path) -> None:
    """An open loop with a 16-token shared prefix and 48-token prompts: the warm-up's p0 (its
    own lead: shares nothing), the run's p0 (nothing seen: its blocks are not the warm-up's), p1
    (the shared block, 16 tokens), p0 again (all 3 blocks seen; the last token is computed: 32
    tokens). 48 of 192 served, arriving when the schedule meant them to; a record without a
    prompt length is left out and said."""
    at = [{"intended_s": float(t), "start_s": t + 0.5} for t in range(5)]
    records = [
        {"prompt_id": "p0", "phase": "warmup", "prompt_tokens": 48, **at[0]},
        {"prompt_id": "p0", "prompt_tokens": 48, **at[1]},
        {"prompt_id": "p1", "prompt_tokens": 48, **at[2]},
        {"prompt_id": "p0", "prompt_tokens": 48, **at[3]},
        {"prompt_id": "p1", "prompt_tokens": None, "ok": False, "completion_tokens": None, **at[4]},
    ]
    folder = result_folder(tmp_path / "runs", {"kind": "open_loop", "shared_prefix_tokens": 16}, records)
    doc = replayed(tmp_path, folder)
    f = doc["configurations"][0]["figures"]
    assert f["requests"] == 4 and f["prompt_tokens"] == 192 and f["tiers"][0]["served_tokens"] == 48
    assert doc["result"]["arrivals"] == "intended" and doc["result"]["left_out"] == 1


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("trace", "size the trace itself ([workload] trace = 'traces/x.jsonl'"),
        ("two arms", "its newest run has 2 arms (a, b): say which to replay ([workload] arm = ...)"),
        ("no such arm", "no arm named 'c' in its newest run (arms: a, b)"),
        ("not a result", "no run.json here or in the folders below"),
    ],
)
def test_a_result_folder_that_cannot_be_replayed_is_refused_by_name(tmp_path: Path, how: str, says: str) -> None:
    record = {"prompt_id": "p0", "prompt_tokens": 48, "start_s": 0.0}
    runs = tmp_path / "runs"
    kind = {"kind": "trace", "path": "traces/x.jsonl"} if how == "trace" else {"kind": "closed_loop"}
    folder = result_folder(runs, kind, [record])
    if how in ("two arms", "no such arm"):
        result_folder(runs, kind, [record], arm="b")
        folder = runs
    text = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1MB"').read_text()
    arm = '\narm = "c"' if how == "no such arm" else ""
    where = tmp_path / "empty" if how == "not a result" else folder
    where.mkdir(exist_ok=True)
    f = tmp_path / "r.toml"
    f.write_text(text.replace('trace = "t.jsonl"', f'result = "{where}"{arm}'))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("workload", "key"),
    [
        ('trace = "t.jsonl"\nresult = "runs"', "workload.result"),
        ("rate_scale = 2.0", "workload.trace"),
        ('result = "runs"\nformat = "mooncake"', "workload.format"),
        ('trace = "t.jsonl"\narm = "a"', "workload.arm"),
        ('scenario = "s.toml"\nresult = "runs"', "workload.scenario"),
        ('scenario = "s.toml"\ntenants = 2', "workload.tenants"),
        ('scenario = "s.toml"\nformat = "mooncake"', "workload.format"),
    ],
)
def test_a_workload_is_a_trace_a_result_folder_or_a_scenarios_plan(tmp_path: Path, workload: str, key: str) -> None:
    text = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = 1').read_text()
    f = tmp_path / "w.toml"
    f.write_text(text.replace('trace = "t.jsonl"', workload))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{f}: {key}" in r.stderr and "Traceback" not in r.stderr, r.stderr


LIVE_SESSIONS = """
name = "live"
[endpoint]
api = "chat"
max_tokens = 32
[metrics]
enabled = false
[workload]
kind = "sessions"
users = 6
turns = 3
think_s = 0.5
system_prompt_tokens = 512
user_context_tokens = 1024
message_tokens = 64
answer_tokens = 32
[emulator]
time_scale = 20.0
"""
# (one connection: with two, a prompt sent while its twin was still being answered found none of
# its blocks cached live, where the replay finds them: 704 tokens apart on a busy machine)
LIVE_POOL = """
name = "live"
[workload]
kind = "closed_loop"
pool = 4
prompt_tokens = 1000
shared_prefix_tokens = 300
requests = 24
concurrency = 1
[endpoint]
max_tokens = 16
[metrics]
enabled = false
[emulator]
time_scale = 20.0
"""
# How far the tokens a result folder's replay serves from a tier that holds everything may be from
# what the emulator served the same requests live (its prefix cache of 16-token blocks), as a share
# of the prompt tokens: measured 0.6 points for the sessions (22,528 predicted against 22,336 live
# of 30,978: the lead and chat template before the system prompt move the blocks' edges), 0 for the
# pool (20,704 of 24,000 both)
REPLAY_TOLERANCE = 0.02


@pytest.mark.parametrize("scenario", [LIVE_SESSIONS, LIVE_POOL], ids=["sessions", "pool"])
def test_a_result_folder_replayed_serves_what_the_emulator_served_it_live(tmp_path: Path, scenario: str) -> None:
    """A sessions run and a closed loop over a pool with a shared prefix, run against the emulator,
    then sized from their result folders on one worker whose G1 holds everything: the tokens the
    replay serves from it are within REPLAY_TOLERANCE of those the emulator reported cached. And
    sized from the scenario's plan alone (`[workload] scenario`): the same."""
    from tests.conftest import arm_folders, write_scenario

    sc = write_scenario(tmp_path / "live.toml", scenario)
    r = kvbench("run", str(sc), "--out", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "runs", "live").values()
    records = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    prompt, cached = sum(r["prompt_tokens"] for r in records), sum(r["cached_tokens"] or 0 for r in records)
    text = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "10GB"').read_text()
    f = tmp_path / "r.toml"
    f.write_text(text.replace('trace = "t.jsonl"', f'result = "{folder}"'))
    got = size(tmp_path, f)["configurations"][0]["figures"]
    assert got["requests"] == len(records) and got["prompt_tokens"] == prompt
    assert abs(got["tiers"][0]["served_tokens"] - cached) / prompt <= REPLAY_TOLERANCE, (got["tiers"], cached)
    # the scenario's plan, not run: the same requests, less the tokens the prompt builder adds
    # (measured: 30,528 of 30,978 for the sessions, 25 a prompt; the pool's 24,000 both), and
    # what it serves as close (measured: 22,336 and 20,704, what the emulator served, both)
    f.write_text(text.replace('trace = "t.jsonl"', f'scenario = "{sc}"'))
    planned = size(tmp_path / "plan", f)["configurations"][0]["figures"]
    assert planned["requests"] == len(records) and 0 <= prompt - planned["prompt_tokens"] <= REPLAY_TOLERANCE * prompt
    assert abs(planned["tiers"][0]["served_tokens"] - cached) / prompt <= REPLAY_TOLERANCE, (planned["tiers"], cached)


def test_the_engines_cost_is_fitted_to_a_ttft_sweeps_result_folder(tmp_path: Path) -> None:
    """A sweep whose cold TTFTs are exactly 2e-5 n + 3e-10 n^2 s at three lengths (warm ones far
    below, not fitted) and whose answers take 0.015 s a token after the first: `fit_from` gives
    that cost, the KV bytes per token of the run's [model], and says where it came from; a
    number given beside it overrides the fit's."""
    a, b, d = 2e-5, 3e-10, 0.015
    records = []
    for n in (1000, 4000, 16000):
        for phase, ttft in (("cold", a * n + b * n * n), ("warm", 0.01)):
            for _ in range(2):
                at = {"prompt_id": f"L{n}", "phase": phase, "prompt_tokens": n, "target_tokens": n}
                records.append({**at, "start_s": 0.0, "ttft_s": ttft, "e2e_s": ttft + d * 9, "completion_tokens": 10})
    folder = result_folder(tmp_path / "runs", {"kind": "sweep"}, records)
    run = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(
        json.dumps({**run, "scenario": {**run["scenario"], "model": {"kv_bytes_per_token": 2000}}})
    )
    text = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1MB"').read_text()
    text = text.replace("prefill_a = 0.001\nprefill_b = 0.0\ndecode_s_per_token = 0.01\n", f'fit_from = "{folder}"\n')
    f = tmp_path / "fit.toml"
    f.write_text(text.replace(f"kv_bytes_per_token = {KV}", ""))
    engine = size(tmp_path / "fit", f)["engine"]
    assert engine["prefill_a"] == pytest.approx(a) and engine["prefill_b"] == pytest.approx(b)
    assert engine["decode_s"] == pytest.approx(d)
    assert f"fitted to {folder}" in engine["source"] and "6 cold requests at 3 lengths" in engine["source"]
    f.write_text(f.read_text().replace("[engine]\n", "[engine]\ndecode_s_per_token = 0.5\n"))
    engine = size(tmp_path / "given", f)["engine"]
    assert engine["decode_s"] == 0.5 and engine["prefill_b"] == pytest.approx(b) and "as given" in engine["source"]
    doc = json.loads(next((tmp_path / "given" / "out").glob("*/*/sizing.json")).read_text())
    assert doc["model"]["kv_bytes_per_token"] == 2000


def test_an_engine_fitted_to_a_folder_that_is_not_a_sweep_is_refused(tmp_path: Path) -> None:
    folder = result_folder(tmp_path / "runs", {"kind": "closed_loop"}, [{"prompt_id": "p0", "start_s": 0.0}])
    text = sizing_file(tmp_path, '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1MB"').read_text()
    f = tmp_path / "fit.toml"
    f.write_text(
        text.replace("prefill_a = 0.001\nprefill_b = 0.0\ndecode_s_per_token = 0.01\n", f'fit_from = "{folder}"\n')
    )
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "expected a TTFT sweep's result folder" in r.stderr and "Traceback" not in r.stderr
    f.write_text(f.read_text().replace("[engine]\n", '[engine]\nprofile = "redbooks-g4"\n'))
    r = kvbench("size", str(f), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and f"{f}: engine.fit_from: expected profile or fit_from, not both" in r.stderr


LLAMA_SESSIONS = """
name = "llama"
[metrics]
enabled = false
[workload]
kind = "sessions"
users = 3
turns = 3
think_s = 0.2
system_prompt_tokens = 200
user_context_tokens = 600
message_tokens = 30
answer_tokens = 4
"""
# The llama.cpp live check's tolerance: the tokens sized against those llama-server reported
# cached, as a share of the prompt tokens. Measured 0.7 points (5,568 sized against 5,626 cached of
# 8,037): llama.cpp reuses tokens, not 16-token blocks, and its first request found the lead and
# system prompt the prompt builder's counting had left in its slot
LLAMA_TOLERANCE = 0.02


@pytest.mark.engine
def test_sized_sessions_serve_what_llamacpps_slot_and_host_cache_served_live(tmp_path: Path) -> None:
    """Three sessions of three turns on llama-server with one slot and its host-memory prompt
    cache (--cache-ram): each later turn finds its history in the host cache (the slot held another
    session's prompt since), so the sizing's G1 (one worker, about one prompt's room) and G2 (room
    for all) serve within LLAMA_TOLERANCE of the tokens llama-server reported cached, and the later
    turns' histories past the system prompt from G2."""
    from harness.engines.llamacpp import LlamaServer, binary
    from harness.engines.models import make as make_model
    from tests.conftest import arm_folders, write_scenario

    server = binary()
    if server is None:
        pytest.skip("llama-server is not built here: run engines/llamacpp/build.sh (.ci/run does)")
    make_model(tmp_path / "tiny.gguf")
    sc = write_scenario(tmp_path / "s.toml", LLAMA_SESSIONS)
    with LlamaServer(server, tmp_path / "tiny.gguf", parallel=1, cache_ram_mib=2048) as srv:
        r = kvbench("run", str(sc), "--endpoint", srv.base_url, "--out", str(tmp_path / "runs"), timeout=600)
    assert r.returncode == 0, r.stderr
    (folder,) = arm_folders(tmp_path / "runs", "llama").values()
    records = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    prompt, cached = sum(r["prompt_tokens"] for r in records), sum(r["cached_tokens"] or 0 for r in records)
    tiers = '[[tiers]]\nname = "G1"\nscope = "worker"\ncapacity = "1MB"\n'
    tiers += '[[tiers]]\nname = "G2"\nscope = "worker"\ncapacity = "1GB"'
    f = tmp_path / "r.toml"
    f.write_text(sizing_file(tmp_path, tiers).read_text().replace('trace = "t.jsonl"', f'result = "{folder}"'))
    got = size(tmp_path, f)["configurations"][0]["figures"]
    served = {t["name"]: t["served_tokens"] for t in got["tiers"]}
    assert got["prompt_tokens"] == prompt
    assert abs(sum(served.values()) - cached) / prompt <= LLAMA_TOLERANCE, (served, cached)
    # the later turns' histories past the system prompt (which G1 keeps: every session reads it)
    history = sum(r["cached_tokens"] - 200 for r in records if r["turn"] > 1)
    assert served["G2"] >= 0.9 * history, (served, history)
