"""Old and new code in alternation on the same machine, as ratios in one run: the client's ceiling (one
process, 28 connections, 256 tokens, TTFT 0) and its first-token error against the server's send
time: against bench/engine.py, which streams as an engine does (the role chunk at once, the first
token after 200 ms, then 127 more 10 ms apart; 28 connections, the first 28 requests left out), and
against the firehose (TTFT 200 ms, then the other 255 tokens in one write, one Content-Length body:
a server that writes a response's tokens in one burst) in a closed loop of 28 connections (the first
28 requests left out) and with Poisson arrivals at 140 req/s (about 28 in flight; start times that
do not depend on the client's speed). Each pair runs both trees against a fresh firehose, the old
one first in odd pairs and last in even ones: whichever runs second came out with a closed-loop
first-token mean 0.01-0.07 ms higher, even with the same tree on both sides. The host's load moves
both alike.

    python bench/ab.py REV [pairs] [requests]     # e.g. python bench/ab.py 20845cc 3 3000
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from ceiling import once
from common import CODE, ROOT, checkout, pct
from ttft_accuracy import run as accuracy
from ttft_accuracy import run_engine, run_open

OPEN_RATE = 140.0
BURST = ("--framing", "length", "--one-write")


def errors_of(err: dict[str, list[tuple[float, float]]], i: int) -> str:
    (om, op), (nm, np_) = err["old"][i], err["new"][i]
    return f"old {om:.3f}/{op:.2f} new {nm:.3f}/{np_:.2f}"


def main() -> None:
    rev = sys.argv[1]
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"old": checkout(rev, Path(tmp)), "new": ROOT}
        rps: dict[str, list[float]] = {"old": [], "new": []}
        err: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        err_open: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        err_engine: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        for i in range(pairs):
            for name, tree in list(trees.items())[:: 1 if i % 2 == 0 else -1]:
                CODE["root"] = tree
                rps[name].append(once(n, 28, 1)["rps"])
                _, errs = run_engine(min(n, 600))
                err_engine[name].append((statistics.mean(errs), pct(errs, 99)))
                _, errs = accuracy(min(n, 1500), 28, 0.0, shape=BURST)
                err[name].append((statistics.mean(errs), pct(errs, 99)))
                _, errs = run_open(min(n, 1500), OPEN_RATE, shape=BURST)
                err_open[name].append((statistics.mean(errs), pct(errs, 99)))
            print(
                f"pair {i + 1}: ceiling old {rps['old'][-1]:.0f} new {rps['new'][-1]:.0f} req/s "
                f"({rps['new'][-1] / rps['old'][-1]:.3f}x); first-token error mean/p99 ms, engine-like "
                f"{errors_of(err_engine, -1)}, firehose closed loop {errors_of(err, -1)}, "
                f"open loop {errors_of(err_open, -1)}"
            )
        ratios = [b / a for a, b in zip(rps["old"], rps["new"], strict=True)]
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
        print(f"{rev} -> this tree: ceiling ratio median {statistics.median(ratios):.3f} (pairs {spread})")


if __name__ == "__main__":
    main()
