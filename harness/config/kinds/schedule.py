"""Open-loop send times, drawn before the run (pure, seeded).

- constant: one request every 1/rate seconds;
- poisson: exponential gaps of mean 1/rate (coefficient of variation 1);
- gamma: gamma gaps of shape k and mean 1/rate, coefficient of variation 1/sqrt(k); k = 1 is
  Poisson, k < 1 burstier, k > 1 smoother (vLLM's --burstiness, AIPerf's gamma arrivals).

The first request is sent at 0. Times are model seconds after the start of the load.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from harness.config.kinds.open_loop import OpenLoopConfig


def _rng(seed: int, rate: float) -> np.random.Generator:
    """One stream per (seed, rate): each rate of a sweep has its own reproducible times."""
    return np.random.default_rng([seed, int.from_bytes(struct.pack("<d", rate), "little")])


def gaps(arrivals: str, rate: float, n: int, shape: float, rng: np.random.Generator) -> np.ndarray:
    """n inter-arrival gaps of the process at `rate` req/s."""
    if arrivals == "constant":
        return np.full(n, 1.0 / rate)
    if arrivals == "poisson":
        return rng.exponential(1.0 / rate, n)
    return rng.gamma(shape, 1.0 / (shape * rate), n)


def send_times(w: OpenLoopConfig, rate: float, seed: int) -> np.ndarray:
    """Send times at `rate`: warm-up requests first, then `requests`, or as many as arrive
    within `duration_s` after the warm-up."""
    rng = _rng(seed, rate)
    if w.duration_s is None:
        g = gaps(w.arrivals, rate, w.warmup_requests + w.requests, w.gamma_shape, rng)
        return np.concatenate(([0.0], np.cumsum(g[:-1])))
    g = gaps(w.arrivals, rate, w.warmup_requests, w.gamma_shape, rng)
    times = list(np.concatenate(([0.0], np.cumsum(g)))[: w.warmup_requests]) if w.warmup_requests else []
    start = float(np.sum(g)) if w.warmup_requests else 0.0
    # enough gaps for the duration with a wide margin, drawn in blocks until it is covered
    block = max(16, math.ceil(rate * w.duration_s * 1.2) + 16)
    t, measured = start, []
    while t - start < w.duration_s:
        for x in gaps(w.arrivals, rate, block, w.gamma_shape, rng):
            if t - start >= w.duration_s:
                break
            measured.append(t)
            t += float(x)
    return np.asarray(times + measured, dtype=np.float64)
