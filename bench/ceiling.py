"""The client's ceiling: how many streamed requests per second (256 output tokens each) kvbench
sustains against bench/firehose.py (TTFT 0, pinned to core 1). Medians of 3 runs, with the
spread.

Rows: one process on core 0 at 28 connections, this tree and an older one (--against, default
BASELINE: the tree before the streaming fast path) in alternation, with the ratio; then this
tree at 256 connections; then `--workers N` (default: one per core) with 28 connections per
worker, on every core but the server's, or on all cores where there are not enough spare ones.
Scaling is the workers' rate over the one process's, and efficiency is that over the cores the
client really had: on a 2-core machine the second worker shares core 1 with the server, whose
CPU use is measured during the run and subtracted.

    python bench/ceiling.py [requests] [workers] [--against REV|none]   # defaults 4000, cores
    python bench/ceiling.py https [requests]   # this tree over http and https in alternation
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import CODE, ROOT, SERVER_CORE, STREAMING, Firehose, checkout, client_cores, kvbench_run

# The tree before the streaming fast path (issue 18): what its 1.6x is measured against.
BASELINE = "4c8ab78"


def once(n: int, conc: int, workers: int, tls: bool = False) -> dict[str, float]:
    """One run: req/s, tok/s, client CPU, loop lag p99, and the server's share of its core
    (`tls`: over https)."""
    with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=256, tls=tls) as fh:
        before = fh.cpu_s()
        (folder,) = kvbench_run(
            STREAMING.format(name="ceiling", requests=n, concurrency=conc),
            fh.base_url,
            Path(tmp),
            ["--workers", str(workers)] if workers > 1 else None,
            cores=client_cores(workers),
        )
        meta = json.loads((folder / "run.json").read_text())
        server = (fh.cpu_s() - before) / meta["summary"]["duration_s"]
    return {
        "rps": meta["summary"]["req_per_s"],
        "tps": meta["summary"]["output_tokens_per_s"],
        "cpu": meta["client_health"]["cpu_share_of_one_core"]["mean"] or 0,
        "lag": meta["client_health"]["loop_lag_ms"]["p99"] or 0,
        "server": server,
    }


def row(label: str, conc: int, rs: list[dict[str, float]], tree: str = "") -> None:
    med = statistics.median
    rps = [r["rps"] for r in rs]
    print(
        f"{label:>9s}  {conc:11d}  {med(rps):7.0f} ({min(rps):.0f}-{max(rps):.0f})"
        f"{med(r['tps'] for r in rs):24.0f}  {med(r['cpu'] for r in rs):9.0%}  {med(r['lag'] for r in rs):8.2f}"
        + (f"  {tree}" if tree else "")
    )


def against(n: int, rev: str) -> None:
    """One-process runs (28 connections) of `rev` and of this tree in alternation: both rows and
    the ratio."""
    with tempfile.TemporaryDirectory() as tmp:
        trees = {rev: checkout(rev, Path(tmp)), "this tree": ROOT}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for _ in range(3):
            for name, tree in trees.items():
                CODE["root"] = tree
                runs[name].append(once(n, 28, 1))
        CODE["root"] = ROOT
    for name, rs in runs.items():
        row("1", 28, rs, name)
    ratios = sorted(b["rps"] / a["rps"] for a, b in zip(runs[rev], runs["this tree"], strict=True))
    print(f"  this tree / {rev}: {ratios[1]:.2f}x (pairs {ratios[0]:.2f}-{ratios[-1]:.2f})")


def https(n: int) -> None:
    """This tree over http and over https (TLS on the same path), in alternation: both rows and
    the ratio."""
    runs: dict[str, list[dict[str, float]]] = {"http": [], "https": []}
    for _ in range(3):
        for scheme in runs:
            runs[scheme].append(once(n, 28, 1, tls=scheme == "https"))
    for scheme, rs in runs.items():
        row("1", 28, rs, scheme)
    ratios = sorted(b["rps"] / a["rps"] for a, b in zip(runs["http"], runs["https"], strict=True))
    print(f"  https / http: {ratios[1]:.2f}x (pairs {ratios[0]:.2f}-{ratios[-1]:.2f})")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["https"]:  # python bench/ceiling.py https [requests]
        print("processes  connections  req/s (median, min-max of 3)  tok/s (median)  client CPU  loop lag p99 ms")
        https(int(args[1]) if len(args) > 1 else 4000)
        return
    rev = BASELINE
    if "--against" in args:
        i = args.index("--against")
        rev = args[i + 1]
        del args[i : i + 2]
    n = int(args[0]) if args else 4000
    workers = int(args[1]) if len(args) > 1 else os.cpu_count() or 1
    print("processes  connections  req/s (median, min-max of 3)  tok/s (median)  client CPU  loop lag p99 ms")
    if rev != "none":
        against(n, rev)
    else:
        row("1", 28, [once(n, 28, 1) for _ in range(3)])
    row("1", 256, [once(n, 256, 1) for _ in range(3)])
    if workers > 1:
        # One process and the workers in alternation, so that both see the same machine (shared
        # and noisy): scaling is the median of the three pairs' ratios.
        one, many = [], []
        for _ in range(3):
            one.append(once(n, 28, 1))
            many.append(once(n, 28 * workers, workers))
        row(str(workers), 28 * workers, many)
        cores = client_cores(workers)
        shared = statistics.median(r["server"] for r in many) if SERVER_CORE in cores else 0.0
        available = len(cores) - shared
        ratios = sorted(m["rps"] / o["rps"] for o, m in zip(one, many, strict=True))
        scaling = ratios[1]
        print(
            f"  {workers} workers on cores {sorted(cores)}: {scaling:.2f}x one process (pairs {ratios[0]:.2f}-"
            f"{ratios[-1]:.2f}); the server used {shared:.0%} of core {SERVER_CORE}, so the client had"
            f" {available:.2f} cores: efficiency {scaling / available:.0%}"
        )


if __name__ == "__main__":
    main()
