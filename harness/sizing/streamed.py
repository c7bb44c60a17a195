"""The capacity curve of a trace too large to hold (pure; `kvbench trace curve` reads the file):
SHARDS' spatial sample (stack.curve's, stratified) taken as the trace streams past, in memory
bounded by what the sample keeps, not by the trace. docs/sizing.md has the design.

Two passes over the trace's requests, a chunk of `References` at a time:
1. A count-min sketch (conservative update, fixed memory) counts each block's references. A block
   counted 1/rate times or more is *heavy* and kept whole, as stack.curve keeps it: a shared
   prefix's first block moves the whole curve, sampled or not. The sketch never counts too few,
   so every block stack.curve keeps whole is kept whole here; a light block it counts too often
   is kept whole as well, which costs memory and never accuracy.
2. The kept references' stack distances, online: a hash table from block id to slot, each slot
   its block's last touch in a Fenwick tree over touch positions, renumbered when the positions
   run out (the live ones are the distinct blocks kept). Each request's prefix distances are
   binned (exact below stack.EXACT_BINS blocks, then stack.BINS_PER_DOUBLING bins a doubling),
   heavy and light blocks' tokens apart; the light ones are scaled at the end so that the kept
   light blocks' tokens add up to all light blocks' (SHARDS' adjustment). The loop lives in
   stack.py beside stack.distance_loop: both call its Fenwick helpers, and numba's cache does
   not notice a change to a helper in another file.

The error is estimated from the sample itself: two disjoint halves of the light sample (each at
rate/2, the heavy blocks in both) stream beside the whole. Each half's error is about 1.4 times
the whole's, their difference about twice it, so half their largest difference over the
capacities is the estimate given.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.errors import InputError
from harness.sizing.stack import (
    BINS,
    SAMPLE_MODULUS,
    Curve,
    References,
    bin_edges,
    compiled,
    compiled_rehash,
    compiled_stream,
    mixed,
)

SKETCH_ROWS = 4
SKETCH_WIDTH = 4 << 20  # counters a row: 64 MiB of uint32 in all, whatever the trace's length
SKETCH_SEED = 1 << 20  # the rows' hashes' seeds start here, apart from the sample's
MIN_POSITIONS = 1 << 16  # the Fenwick tree's positions, at least
MIN_TABLE = 1 << 16  # the hash table's entries, at least (a power of two)
HALVES = 2
# Where the heavy blocks' references are this share of all or more, the estimate of the error was
# measured low by a factor of 2-20 (docs/sizing.md): the output says so.
SKEWED = 0.6


class Sketch:
    """Each block's references counted in fixed memory (count-min, conservative update): never
    fewer than the block has, more where blocks share all their counters."""

    def __init__(self, rows: int = SKETCH_ROWS, width: int = SKETCH_WIDTH) -> None:
        self.counts = np.zeros((rows, width), dtype=np.uint32)

    def add(self, blocks: np.ndarray) -> None:
        _compiled_sketch()(self.counts, self._columns(blocks))

    def estimate(self, blocks: np.ndarray) -> np.ndarray:
        rows = np.arange(len(self.counts))[:, None]
        return np.asarray(self.counts[rows, self._columns(blocks)].min(axis=0))

    def _columns(self, blocks: np.ndarray) -> np.ndarray:
        width = np.uint64(self.counts.shape[1])
        return np.stack([(mixed(blocks, SKETCH_SEED + r) % width).astype(np.int64) for r in range(len(self.counts))])


def sketch_add(counts: np.ndarray, columns: np.ndarray) -> None:  # pragma: no cover
    """Count each reference (`columns`: its counter in each row): only the counters at the
    block's least count go up (conservative update). (Run compiled.)"""
    rows, n = columns.shape
    for j in range(n):
        least = counts[0, columns[0, j]]
        for r in range(1, rows):
            least = min(least, counts[r, columns[r, j]])
        if least == 0xFFFFFFFF:
            continue
        for r in range(rows):
            if counts[r, columns[r, j]] == least:
                counts[r, columns[r, j]] = least + 1


class Sample:
    """One sample's binned prefix distances, streamed: the heavy blocks and the light ones whose
    hash (modulo SAMPLE_MODULUS) lies in [lo, hi), each light block standing for `light_weight`."""

    def __init__(self, lo: int, hi: int, light_weight: float) -> None:
        self.lo, self.hi, self.light_weight = lo, hi, light_weight
        self.keys = np.zeros(MIN_TABLE, dtype=np.int64)
        self.slot_of = np.full(MIN_TABLE, -1, dtype=np.int64)
        self.pos = np.zeros(MIN_POSITIONS, dtype=np.int64)
        self.weight = np.zeros(MIN_POSITIONS, dtype=np.float64)
        self.tree = np.zeros(MIN_POSITIONS + 1, dtype=np.float64)
        self.hist = np.zeros((2, BINS), dtype=np.float64)  # tokens by bin: heavy blocks', light ones'
        self.ints = np.array([0, -1, 0], dtype=np.int64)  # next position, the request now, slots used
        self.floats = np.zeros(2, dtype=np.float64)  # weight marked in the tree, the request's running maximum
        self.kept = 0
        self.light_tokens = 0

    def feed(
        self, blocks: np.ndarray, request: np.ndarray, serves: np.ndarray, heavy: np.ndarray, h: np.ndarray
    ) -> None:
        keep = heavy | ((h >= self.lo) & (h < self.hi))
        self.kept += int(keep.sum())
        self.light_tokens += int(serves[keep & ~heavy].sum())
        args = (blocks[keep], request[keep], serves[keep], heavy[keep], self.light_weight)
        done, loop = 0, compiled_stream()
        while (done := loop(*args, done, *self._state())) < len(args[0]):
            self._grow()

    def curve(self, light_tokens: int, prompt_tokens: int, rate: float) -> Curve:
        """Tokens served against capacity, stepping at each bin's last distance (exact at a bin's
        end, the bin's start's figure inside it)."""
        scale = light_tokens / self.light_tokens if self.light_tokens else 0.0
        tokens = self.hist[0] + scale * self.hist[1]
        filled = np.flatnonzero(tokens > 0)
        return Curve(bin_edges()[filled + 1] - 1, np.cumsum(tokens)[filled], prompt_tokens, rate)

    def _state(self) -> tuple[Any, ...]:
        shift = 64 - (len(self.keys).bit_length() - 1)
        return shift, self.keys, self.slot_of, self.pos, self.weight, self.tree, self.hist, self.ints, self.floats

    def _grow(self) -> None:
        """Room for the loop to go on: a table twice as large, more slots, or the positions
        renumbered 0.. in their order (the tree rebuilt from the slots' weights)."""
        used = int(self.ints[2])
        if 2 * used >= len(self.keys):
            keys, slot_of = np.zeros(2 * len(self.keys), dtype=np.int64), np.full(2 * len(self.keys), -1, np.int64)
            filled = self.slot_of >= 0
            compiled_rehash()(self.keys[filled], self.slot_of[filled], keys, slot_of, 64 - (len(keys).bit_length() - 1))
            self.keys, self.slot_of = keys, slot_of
        if used >= len(self.pos):
            self.pos = np.resize(self.pos, 2 * len(self.pos))
            self.weight = np.resize(self.weight, 2 * len(self.weight))
        if self.ints[0] >= len(self.tree) - 1:
            order = np.argsort(self.pos[:used], kind="stable")
            self.pos[order] = np.arange(used)
            at = np.zeros(max(MIN_POSITIONS, 4 * used), dtype=np.float64)
            at[self.pos[:used]] = self.weight[:used]
            cum = np.r_[0.0, np.cumsum(at)]
            i = np.arange(1, len(at) + 1)
            self.tree = np.r_[0.0, cum[i] - cum[i - (i & -i)]]
            self.ints[0] = used
            self.floats[0] = cum[-1]


@functools.cache
def _compiled_sketch() -> Any:
    return compiled(sketch_add)


@dataclass(frozen=True)
class Streamed:
    """A streamed capacity curve and what it rests on."""

    curve: Curve
    error: float  # estimated largest error of its shares (0 where every block was kept)
    requests: int
    references: int
    kept: int  # references the sample kept
    heavy_blocks: int  # distinct blocks kept whole
    heavy_references: int  # their references


def counted(chunks: Iterable[References], sketch: Sketch) -> None:
    """The first pass: every reference counted in the sketch."""
    for refs in chunks:
        sketch.add(refs.blocks)


def streamed(chunks: Iterable[References], rate: float, sketch: Sketch | None, seed: int = 0) -> Streamed:
    """The second pass: the curve of the sample at `rate` (1: every block, exactly but for the
    bins; `sketch` then unused) of the references of requests in time order, a chunk at a time."""
    if not HALVES / SAMPLE_MODULUS <= rate <= 1:  # (below: a half of the sample would hold no hash)
        raise InputError(f"sampling rate: expected a number from {HALVES}/{SAMPLE_MODULUS:,} to 1, got {rate}")
    cut = int(rate * SAMPLE_MODULUS)
    whole = Sample(0, cut, 1 / rate)
    halves = (
        [] if rate == 1 else [Sample(k * cut // HALVES, (k + 1) * cut // HALVES, HALVES / rate) for k in range(HALVES)]
    )
    requests = references = heavy_references = light_tokens = prompt_tokens = 0
    for refs in chunks:
        h = mixed(refs.blocks, seed) % np.uint64(SAMPLE_MODULUS)
        if sketch is None or rate == 1:
            heavy = np.zeros(len(refs.blocks), dtype=bool)
        else:
            heavy = sketch.estimate(refs.blocks) >= 1 / rate
        request = refs.request.astype(np.int64) + requests
        for sample in (whole, *halves):
            sample.feed(refs.blocks, request, refs.serves, heavy, h)
        requests += refs.requests
        references += len(refs.blocks)
        heavy_references += int(np.count_nonzero(heavy))
        light_tokens += int(refs.serves[~heavy].sum())
        prompt_tokens += refs.prompt_tokens
    curve = whole.curve(light_tokens, prompt_tokens, rate)
    error = 0.0
    if halves:
        a, b = (s.curve(light_tokens, prompt_tokens, rate / HALVES) for s in halves)
        at = bin_edges()
        error = float(np.max(np.abs(a.share(at) - b.share(at)))) / 2 if prompt_tokens else 0.0
    heavy_blocks = int(np.count_nonzero(whole.weight[: whole.ints[2]] == 1.0)) if rate < 1 else 0
    return Streamed(curve, error, requests, references, whole.kept, heavy_blocks, heavy_references)
