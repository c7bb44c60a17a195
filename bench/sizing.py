"""Capacity curves (harness/sizing/stack.py): how long one pass takes, compiled and in plain
Python, and how far SHARDS' sampled curves are from the exact ones, on synthetic traces of
shared documents (harness/sizing/synthetic.py: 10,000 documents of 1-32 blocks, 2 blocks of each
request's own, Zipf popularity of exponent alpha).

    python bench/sizing.py [requests]      # default 1000000
    python bench/sizing.py fleet [requests]  # default 1000000
    python bench/sizing.py sweep [requests] [processes]  # default 10000000 2
    python bench/sizing.py sessions [users]  # default 1000
    python bench/sizing.py read [requests]  # default 1000000
    python bench/sizing.py curve [requests]  # default 1000000

Prints: the plain-Python loop against the compiled one on the same 20,000 requests (the ratio);
then per alpha the exact curve's time, the sampled curve's (1 %, two seeds), the share of
references the sample kept (its heavy blocks whole), and the largest absolute error of the
sampled share over 300 capacities from one block to past the whole trace; then the same sample
streamed as `kvbench trace curve --sample 0.01` takes it (harness/sizing/streamed.py, its heavy
blocks found by the sketch): its largest error at the end of every bin, and the error it
estimated of itself.

`fleet`: the timing's event loop (harness/sizing/simulate.py) as plain Python against compiled on
the same 20,000 requests (the ratio; the results must be identical), then one configuration
sized whole (`fleet.size`: routes, scoped distances, both simulations, curves, and the SLO
capacity search's ~15 more simulations) on 64 workers, 8 a node, a free G1 of 80 GB per worker
and a G4 of 100 TB shared at 100 GB/s, Poisson arrivals at 100 req/s, alpha 1.

`sweep`: the same fleet swept over the G4's capacity (25, 50, 100, 200 TB) and read bandwidth
(50, 100, 200, 400 GB/s), 16 configurations, by the command's own sweep (`commands/size.py`
`each_sized`: each Placement and Baseline once, then the configurations, in `processes` spawned
processes), without request rows: the workload's generation, the sweep's time and its largest
process's peak RSS (this one's, or any child's), and each configuration's G4 share, read p99,
TTFT p50 and SLO capacity ratio.

`sessions`: a scenario's plan sized without running it (`[workload] scenario`,
harness/sizing/planned.py): the shipped multi-turn sessions scenario with `users` users starting
at users/50 a second (4 turns each, about a minute of thinking, 22,000-token histories and more),
on 64 workers with the G1 and G4 above and a 2 s TTFT SLO: the plan's reading, the sizing's
time (its arrivals settled with the tiers and recomputing, and again at each speed-up of the SLO
search), the passes each took, the peak RSS, and the figures.

`read`: a Mooncake JSONL file of `requests` lines written from the synthetic trace (shared
documents, alpha 1), then read for sizing two ways, each in a process of its own: every request an
object (`traces.read`, then `fleet.from_trace`), and a line at a time into columns (`Reading`,
`TraceColumns`, `fleet.from_columns`: what `kvbench size` does); each one's time and peak RSS,
and whether the two workloads are the same.

`curve`: the same file's capacity curve streamed by `kvbench trace curve` (harness/sizing/
streamed.py), every block kept and sampled at 1 %, each in a process of its own: its time and
peak RSS, the share of references the sample kept, the error it estimated of itself and its
largest error against the exact curve at the end of every bin.
"""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import replace

import numpy as np

from harness.sizing import fleet, simulate, stack, streamed, synthetic
from harness.sizing.tiers import Fleet

DOCS, DOC_BLOCKS, OWN, BLOCK = 10_000, 32, 2, 512


def trace(n: int, alpha: float) -> stack.References:
    return synthetic.shared_documents(n, DOCS, DOC_BLOCKS, OWN, alpha, BLOCK)


def plain_against_compiled() -> None:
    refs = trace(20_000, 1.0)
    _, dense = np.unique(refs.blocks, return_inverse=True)
    args = (
        dense.astype(np.int64),
        int(dense.max()) + 1,
        refs.request,
        np.ones(len(dense)),
        np.zeros(len(dense), dtype=np.int64),
    )
    compiled = stack.compiled_loop()
    compiled(*args)  # compiled (or loaded from the cache) outside the timing
    t0 = time.perf_counter()
    fast = compiled(*args)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = stack.distance_loop(*args)
    t_slow = time.perf_counter() - t0
    assert np.array_equal(fast, slow)
    print(f"{len(dense):,} references: plain Python {t_slow:.2f} s, compiled {t_fast:.4f} s ({t_slow / t_fast:.0f}x)")


KV = 73728  # gpt-oss-120b's KV bytes per token, as the Redbooks profile has it


def workload(n: int) -> fleet.Workload:
    refs = trace(n, 1.0)
    per = np.bincount(refs.request, minlength=n)
    arrival = np.cumsum(np.random.default_rng(1).exponential(1 / 100.0, n))
    return fleet.Workload(refs, arrival, per * BLOCK - 10, np.full(n, 200), BLOCK)


def plan() -> fleet.Plan:
    g1 = fleet.TierPlan("G1", "worker", 80 * 10**9 // (BLOCK * KV), simulate.Tier(0.0, None))
    g4 = fleet.TierPlan("G4", "cluster", 100 * 10**12 // (BLOCK * KV), simulate.Tier(0.001, 100e9))
    return fleet.Plan(Fleet(64, 8), (g1, g4), KV, simulate.Cost(4.1e-5, 1.6e-9, 0.02), 2.0, 0.9, 1.0)


def fleet_sizing(n: int) -> None:
    w, p = workload(20_000), plan()
    reqs, _ = fleet._placed(w, p)
    timing = [t.timing for t in p.tiers]
    simulate.simulate(reqs, timing, KV, p.cost)  # compiled (or loaded from the cache) outside the timing
    t0 = time.perf_counter()
    fast = simulate.simulate(reqs, timing, KV, p.cost)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    slow = simulate.run(simulate.event_loop, reqs, timing, KV, p.cost)
    t_slow = time.perf_counter() - t0
    assert np.array_equal(fast.ttft_s, slow.ttft_s) and np.array_equal(fast.e2e_s, slow.e2e_s)
    print(f"20,000 requests' events: plain Python {t_slow:.2f} s, compiled {t_fast:.4f} s ({t_slow / t_fast:.0f}x)")
    w = workload(n)
    t0 = time.perf_counter()
    sized = fleet.size(w, p)
    slo = sized.figures["slo"]
    print(
        f"{n:,} requests sized on 64 workers with the SLO search: {time.perf_counter() - t0:.1f} s "
        f"(TTFT p50 {sized.figures['ttft_s']['p50']:.3f} s, SLO capacity ratio {slo['capacity_ratio']})"
    )


def sweep(n: int, processes: int) -> None:
    from harness.commands.size import each_sized

    t0 = time.perf_counter()
    w = workload(n)
    print(f"{n:,} requests ({len(w.refs.blocks):,} block references) generated in {time.perf_counter() - t0:.1f} s")
    base = plan()
    g1, g4 = base.tiers
    plans = [
        replace(
            base,
            tiers=(g1, replace(g4, capacity_blocks=tb * 10**12 // (BLOCK * KV), timing=simulate.Tier(0.001, gb * 1e9))),
        )
        for tb in (25, 50, 100, 200)
        for gb in (50, 100, 200, 400)
    ]
    t0 = time.perf_counter()
    done = dict(each_sized(w, plans, processes, rows=False))
    took = time.perf_counter() - t0
    peak = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(f"{len(plans)} configurations in {processes} processes: {took:.1f} s, largest peak RSS {peak / 2**20:.2f} GB")
    for i, p in enumerate(plans):
        f = done[i].figures
        g4f, slo, g4 = f["tiers"][1], f["slo"], p.tiers[1]
        print(
            f"  G4 {g4.capacity_blocks * BLOCK * KV / 1e12:5.0f} TB {(g4.timing.bandwidth or 0) / 1e9:4.0f} GB/s: "
            f"G4 share {g4f['share']:.3f}, read p99 {g4f['read_bytes_per_s']['p99'] / 1e9:6.1f} GB/s, "
            f"TTFT p50 {f['ttft_s']['p50']:.3f} s, SLO capacity ratio {slo['capacity_ratio']}"
        )


def sessions(users: int) -> None:
    import tempfile
    from pathlib import Path

    from harness.sizing import planned

    shipped = (Path(__file__).parent.parent / "scenarios" / "multi-turn-sessions.toml").read_text()
    text = shipped.replace("users = 24", f"users = {users}").replace("start_rate = 0.5", f"start_rate = {users / 50}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sessions.toml"
        path.write_text(text)
        t0 = time.perf_counter()
        d = planned.read(path, 16, 1.0).plan
    print(
        f"{users:,} users: {d.refs.requests:,} requests, {len(d.refs.blocks):,} block references, read in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    p = plan()
    g1, g4 = (replace(t, capacity_blocks=t.capacity_blocks * BLOCK // 16) for t in p.tiers)  # 16-token blocks
    p = replace(p, tiers=(g1, g4))
    t0 = time.perf_counter()
    sized = fleet.size(d, p)
    took = time.perf_counter() - t0
    f, slo = sized.figures, sized.figures["slo"]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"sized in {took:.1f} s, peak RSS {peak:.2f} GB; arrivals {f['arrivals']}")
    print(
        f"G1 share {f['tiers'][0]['share']:.3f}, G4 share {f['tiers'][1]['share']:.3f}, TTFT p50 "
        f"{f['ttft_s']['p50']:.3f} s (recomputing {f['recompute_ttft_s']['p50']:.3f} s), SLO capacity "
        f"{slo['cached']['capacity_req_per_s']:.3g} req/s against {slo['recompute']['capacity_req_per_s']:.3g}, "
        f"not settled at {slo['cached']['unsettled_speedups']} / {slo['recompute']['unsettled_speedups']}"
    )


READ = {
    "objects": "w = fleet.from_trace(traces.read(path).requests, 512, 1.0)",
    "columns": "r = traces.Reading(path); w = fleet.from_columns(stack.TraceColumns.of(r.requests()), r.block, 1.0)",
}
READ_CHILD = """
import resource, sys, time, hashlib
from harness.inputs import traces
from harness.sizing import fleet, stack
path = sys.argv[1]
t0 = time.perf_counter()
{how}
took = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # (before the digest, which reads in place)
h = hashlib.sha256()
for a in (w.refs.blocks, w.refs.serves, w.arrival_s):
    h.update(memoryview(a))
print(f"{{took:.1f}} s, peak RSS {{peak:.2f}} GB, workload {{h.hexdigest()[:12]}}")
"""


def write_trace(n: int, path: str) -> None:
    """The synthetic trace of n requests as a Mooncake JSONL file (run in a process of its own, so
    that the readers' peak RSS does not start from the synthetic trace's: Linux keeps a process's
    peak across the exec of the child it forks)."""
    import json

    refs = trace(n, 1.0)
    starts = np.concatenate([[0], np.cumsum(np.bincount(refs.request, minlength=n))])
    arrival = np.cumsum(np.random.default_rng(1).exponential(1 / 100.0, n)) * 1000
    with open(path, "w") as f:
        for i in range(n):
            ids = refs.blocks[starts[i] : starts[i + 1]].tolist()
            line = {"timestamp": int(arrival[i]), "input_length": len(ids) * BLOCK - 10, "output_length": 200}
            f.write(json.dumps({**line, "hash_ids": ids}) + "\n")


def read(n: int) -> None:
    import subprocess
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        subprocess.run([sys.executable, __file__, "write-trace", str(n), str(path)], check=True)
        print(f"{n:,} lines, {path.stat().st_size / 2**20:.0f} MiB")
        for name, how in READ.items():
            child = READ_CHILD.format(how=how)
            out = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True, text=True)
            print(f"{name}: {out.stdout.strip() or out.stderr.strip()[-300:]}")


def curves(n: int) -> None:
    import json
    import subprocess
    import tempfile
    from pathlib import Path

    from harness.sizing.stack import bin_edges

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        subprocess.run([sys.executable, __file__, "write-trace", str(n), str(path)], check=True)
        print(f"{n:,} lines, {path.stat().st_size / 2**20:.0f} MiB")
        shares = []
        for rate in ("1", "0.01"):
            out = Path(tmp) / f"{rate}.json"
            child = CURVE_CHILD.format(args=["trace", "curve", str(path), "--sample", rate, "--json", str(out)])
            took = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
            doc = json.loads(out.read_text())
            steps = doc["curve"]
            at = np.searchsorted([s["capacity_blocks"] for s in steps], bin_edges(), side="right")
            shares.append(np.r_[0.0, [s["share"] for s in steps]][at])
            sample = doc["sample"]
            kept = sample["kept_references"] / doc["references"]
            print(
                f"--sample {rate}: {took.stdout.splitlines()[-1]}, {kept:.1%} of {doc['references']:,} references "
                f"kept, estimated error {sample['error_estimate']:.4f}"
            )
        print(
            f"largest error of the sample's shares at the end of every bin: {np.abs(shares[1] - shares[0]).max():.4f}"
        )


CURVE_CHILD = """
import resource, time
from harness.cli import app
t0 = time.perf_counter()
try:
    app({args!r})
except SystemExit as e:
    assert not e.code, e.code
took = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{{took:.1f}} s, peak RSS {{peak:.2f}} GB")
"""


def main() -> None:
    if sys.argv[1:2] == ["curve"]:
        curves(int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000)
        return
    if sys.argv[1:2] == ["write-trace"]:
        write_trace(int(sys.argv[2]), sys.argv[3])
        return
    if sys.argv[1:2] == ["read"]:
        read(int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000)
        return
    if sys.argv[1:2] == ["sessions"]:
        sessions(int(sys.argv[2]) if len(sys.argv) > 2 else 1000)
        return
    if sys.argv[1:2] == ["sweep"]:
        sweep(int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000, int(sys.argv[3]) if len(sys.argv) > 3 else 2)
        return
    if sys.argv[1:2] == ["fleet"]:
        fleet_sizing(int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    plain_against_compiled()
    capacities = np.unique(np.geomspace(1, 10**8, 300).astype(np.int64))
    print("alpha  references   exact_s  sampled_s  kept  max_error  streamed_error  its_estimate")
    for alpha in (0.0, 0.6, 0.8, 1.0, 1.2):
        refs = trace(n, alpha)
        t0 = time.perf_counter()
        exact = stack.curve(refs)
        t_exact = time.perf_counter() - t0
        _, inverse, counts = np.unique(refs.blocks, return_inverse=True, return_counts=True)
        for seed in (0, 1):
            t0 = time.perf_counter()
            sample = stack.curve(refs, 0.01, seed)
            t_sample = time.perf_counter() - t0
            kept = (counts[inverse] >= 100) | stack.sampled(refs.blocks, 0.01, seed)
            err = np.abs(sample.share(capacities) - exact.share(capacities)).max()
            sketch = streamed.Sketch()
            streamed.counted(synthetic.chunks(refs, 32_768), sketch)
            s = streamed.streamed(synthetic.chunks(refs, 32_768), 0.01, sketch, seed)
            edges = stack.bin_edges()
            s_err = np.abs(s.curve.share(edges) - exact.share(edges)).max()
            print(
                f"{alpha:5.1f}  {len(refs.blocks):10,}  {t_exact:8.1f}  {t_sample:9.1f}  {kept.mean():4.0%}  {err:9.4f}"
                f"  {s_err:14.4f}  {s.error:12.4f}"
            )


if __name__ == "__main__":
    main()
