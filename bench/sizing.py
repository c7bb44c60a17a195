"""Capacity curves (harness/sizing/stack.py): how long one pass takes, compiled and in plain
Python, and how far SHARDS' sampled curves are from the exact ones, on synthetic traces of
shared documents (harness/sizing/synthetic.py: 10,000 documents of 1-32 blocks, 2 blocks of each
request's own, Zipf popularity of exponent alpha).

    python bench/sizing.py [requests]      # default 1000000

Prints: the plain-Python loop against the compiled one on the same 20,000 requests (the ratio);
then per alpha the exact curve's time, the sampled curve's (1 %, two seeds), the share of
references the sample kept (its heavy blocks whole), and the largest absolute error of the
sampled share over 300 capacities from one block to past the whole trace.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from harness.sizing import stack, synthetic

DOCS, DOC_BLOCKS, OWN, BLOCK = 10_000, 32, 2, 512


def trace(n: int, alpha: float) -> stack.References:
    return synthetic.shared_documents(n, DOCS, DOC_BLOCKS, OWN, alpha, BLOCK)


def plain_against_compiled() -> None:
    refs = trace(20_000, 1.0)
    _, dense = np.unique(refs.blocks, return_inverse=True)
    args = (dense.astype(np.int64), int(dense.max()) + 1, refs.request, np.ones(len(dense)))
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


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    plain_against_compiled()
    capacities = np.unique(np.geomspace(1, 10**8, 300).astype(np.int64))
    print("alpha  references   exact_s  sampled_s  kept  max_error")
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
            print(
                f"{alpha:5.1f}  {len(refs.blocks):10,}  {t_exact:8.1f}  {t_sample:9.1f}  {kept.mean():4.0%}  {err:9.4f}"
            )


if __name__ == "__main__":
    main()
