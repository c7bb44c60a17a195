"""How many prompt tokens an LRU prefix cache of every capacity would serve over a trace, in one
pass (pure): Mattson's stack algorithm over the trace's KV block references, exactly, or from a
spatial sample of the blocks (SHARDS) for traces too large to hold. docs/sizing.md has the design.

A request touches its blocks in order, first to last, each touch a reference, and a block it
misses is inserted (write-through). A reference's stack distance is the number of distinct blocks
touched since the same block's previous touch (NEVER at a first touch): in an LRU cache of C
blocks it hits exactly when its distance is below C. A server reuses a prompt's cached prefix up
to its first missing block, so a block is served when it and every block before it in its request
hit: its prefix distance is the running maximum of the request's distances. The tokens served at
capacity C are those of the blocks whose prefix distance is below C, never the prompt's last token
(the server computes at least one): the rule of `traces.reuse`, which the tests compare at every
capacity.

The distances come from a Fenwick tree over the positions of each block's last touch, O(N log N),
in a loop numba compiles (`pip install 'kvbench[sizing]'`): in plain Python the same loop ran 89x
slower (bench/sizing.py), some 13 minutes for 10^6 requests where the issue asks for one. The
loop that streams a sampled curve (streamed.py) and its bins are here too: both loops call the
same Fenwick helpers, and numba's cache does not notice a change to a helper in another file.
"""

from __future__ import annotations

import functools
import itertools
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.errors import InputError
from harness.inputs.traces import TraceRequest

NEVER = np.inf  # the distance of a first touch: no capacity serves it
SAMPLE_MODULUS = 1 << 24  # SHARDS: a block is sampled when its hash modulo this is below rate x this
# Past the knee of a capacity curve, doubling the capacity adds less than this share of prompt tokens.
KNEE_GAIN = 0.01
# A streamed curve's bins (streamed.py): one a block below EXACT_BINS blocks, then
# BINS_PER_DOUBLING a doubling (1.6 % of the capacity).
EXACT_BINS = 128
BINS_PER_DOUBLING = 64
BINS = EXACT_BINS + 50 * BINS_PER_DOUBLING  # up to 2^57 blocks
# (both powers of two: the first binned octave's exponent, and the bits a bin of one keeps)
EXACT_OCTAVE = EXACT_BINS.bit_length() - 1
DOUBLING_BITS = BINS_PER_DOUBLING.bit_length() - 1


@dataclass(frozen=True)
class References:
    """A trace's block references in touch order: the block's id, the request it belongs to, and
    the tokens it serves when it hits (0 for a block that can only be inserted: the prompt's last
    token's block, or one past what the prompt covers)."""

    blocks: np.ndarray  # int64, the trace's block ids
    request: np.ndarray  # int32, index of the request (in time order)
    serves: np.ndarray  # int32, tokens
    prompt_tokens: int  # of every request, served or not
    requests: int

    def __post_init__(self) -> None:
        # 32 bits where they hold (a request's index, a block's tokens): some 2x10^8 references
        # in a sizing of 10^7 requests, 800 MB an array less than at 64 bits (no copy when given
        # so, as every producer here and a sizing process's mapped files give them)
        if self.requests < 2**31:
            object.__setattr__(self, "request", self.request.astype(np.int32, copy=False))
        object.__setattr__(self, "serves", self.serves.astype(np.int32, copy=False))

    @functools.cached_property
    def dense(self) -> tuple[np.ndarray, int]:
        """The block ids numbered 0.. in the order of their first touch (a trace's ids may be 63-bit
        hashes; a distance needs only to tell them apart), and how many there are: once, for
        every tier of every configuration sized. By pandas' hash table: numpy's sort (np.unique)
        took 20 s of 10^7 requests' references, 4-6 times as long."""
        if not len(self.blocks):
            return np.zeros(0, dtype=np.int64), 1
        import pandas as pd  # (a dependency of kvbench's; imported where sizing needs it)

        dense, _ = pd.factorize(self.blocks)
        n_keys = int(dense.max()) + 1
        return dense.astype(np.int32 if n_keys < 2**31 else np.int64), n_keys

    @functools.cached_property
    def distances(self) -> np.ndarray:
        """Every reference's prefix distance in the one stream of them all: a cluster-wide tier's,
        whatever the routing and the fleet. Once: for every Placement of a sweep over worker
        counts or routings, and every speed-up a prefix-routed plan's SLO search places again."""
        if not len(self.blocks):
            return np.zeros(0, dtype=np.float64)
        dense, n_keys = self.dense
        # every reference counts 1: one weight seen through a view, not an array of ones (8 bytes
        # a reference, and a sizing of 10^7 requests has some 2x10^8 references)
        ones, one_stream = np.broadcast_to(np.float64(1.0), len(dense)), np.broadcast_to(np.int16(0), len(dense))
        return np.asarray(compiled_loop()(dense, n_keys, self.request, ones, one_stream))

    def reordered(self, order: np.ndarray) -> References:
        """The same references with the requests in another order (`order[k]`: the request that
        comes k-th), each request's references together and in their order, and the block ids'
        numbering carried over (any numbering tells the blocks apart): a scenario's plan is
        placed again at every pass of its settling (sizing/planned.py), and building its
        references from its requests took half of a pass."""
        counts = np.bincount(self.request, minlength=self.requests)
        starts = np.cumsum(counts) - counts
        lengths = counts[order]
        first = np.cumsum(lengths) - lengths  # where each request's references go
        take = np.repeat(starts[order] - first, lengths) + np.arange(int(lengths.sum()))
        out = References(
            self.blocks[take],
            np.repeat(np.arange(self.requests, dtype=np.int32), lengths),
            self.serves[take],
            self.prompt_tokens,
            self.requests,
        )
        dense, n_keys = self.dense
        out.__dict__["dense"] = (dense[take], n_keys)  # (the cached property's value, as `dense` stores it)
        return out


@dataclass(frozen=True)
class TraceColumns:
    """A trace's requests as columns (numpy, a row a request; no object a request: a 10^7-line
    trace held as TraceRequests took more than 10 GB): when each arrives, its prompt and output
    tokens, and its hash ids, all requests' one after the other (`id_count` each)."""

    timestamp_s: np.ndarray  # float64
    input_length: np.ndarray  # int64
    output_length: np.ndarray  # int64
    id_count: np.ndarray  # int64
    ids: np.ndarray  # int64

    @classmethod
    def of(cls, requests: Iterable[TraceRequest]) -> TraceColumns:
        """The requests' columns, as they come (a trace file's `Reading.requests()`, a line at a time)."""
        ts, n_in, n_out, counts, ids = array("d"), array("q"), array("q"), array("q"), array("q")
        for r in requests:
            ts.append(r.timestamp_s)
            n_in.append(r.input_length)
            n_out.append(r.output_length)
            counts.append(len(r.hash_ids))
            before = len(ids)
            try:
                ids.extend(r.hash_ids)
            except OverflowError:  # an unsigned 64-bit id past 2^63: its bits as a signed one's
                del ids[before:]
                ids.extend(h - (1 << 64) if h >= 1 << 63 else h for h in r.hash_ids)
        return cls(
            *(
                np.frombuffer(x, dtype=np.float64 if x.typecode == "d" else np.int64)
                for x in (ts, n_in, n_out, counts, ids)
            )
        )

    @property
    def requests(self) -> int:
        return len(self.timestamp_s)

    def in_time_order(self) -> TraceColumns:
        """The requests sorted by arrival (ties: as they were): as they are, where they were (a
        trace file's timestamps never go back), without a copy."""
        if not len(self.timestamp_s) or bool(np.all(self.timestamp_s[1:] >= self.timestamp_s[:-1])):
            return self
        order = np.argsort(self.timestamp_s, kind="stable")
        starts = np.cumsum(self.id_count) - self.id_count
        counts = self.id_count[order]
        take = np.repeat(starts[order] - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        return TraceColumns(
            self.timestamp_s[order], self.input_length[order], self.output_length[order], counts, self.ids[take]
        )


def references(requests: Sequence[TraceRequest], block_tokens: int) -> References:
    """The references of the requests in time order (ties: as given): `columns_references`."""
    return columns_references(TraceColumns.of(requests).in_time_order(), block_tokens)


def columns_references(c: TraceColumns, block_tokens: int) -> References:
    """The references of requests given in time order. A request touches its first
    input_length // block_tokens blocks (those its prompt fills); the first
    (input_length - 1) // block_tokens of them can be served: all but its last touched one, or
    all. Built without an array of every reference's position (a 10^7-line trace's references
    took 7.4 GB with such arrays, 190 million references): where every request touches all its
    ids its blocks are the trace's ids as they are, else those ids less a byte-a-reference mask."""
    touched = np.minimum(c.id_count, c.input_length // block_tokens)
    usable = np.minimum(c.id_count, (c.input_length - 1) // block_tokens)
    ends = np.cumsum(touched)
    if np.array_equal(touched, c.id_count):
        blocks = c.ids
    else:  # each request's ids past its touched ones left out (a byte an id to mark them)
        short = touched < c.id_count
        ids_end = np.cumsum(c.id_count)[short]
        cut = np.zeros(len(c.ids) + 1, dtype=np.int8)
        cut[ids_end - c.id_count[short] + touched[short]] += 1  # from here to the request's end: not touched
        cut[ids_end] -= 1  # (each request's own indexes: none twice in one assignment)
        blocks = c.ids[np.cumsum(cut[:-1], dtype=np.int8) == 0]
    request = np.repeat(np.arange(c.requests, dtype=np.int32), touched)
    serves = np.full(len(blocks), block_tokens, dtype=np.int32)
    serves[(ends - 1)[usable < touched]] = 0  # (touched and usable differ by one block at most)
    return References(blocks, request, serves, int(c.input_length.sum()), c.requests)


def prefix_distances(blocks: np.ndarray, request: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Every reference's prefix distance: the running maximum, within its request, of the LRU
    stack distances (NEVER from a block's first touch on). References in touch order, each
    request's contiguous. `weight` (per reference, the same for all of a block's): what each
    distinct block counts for in a distance (a sampled block stands for 1/rate blocks); 1 each
    when not given, and the distances are then exact counts."""
    if not len(blocks):
        return np.zeros(0, dtype=np.float64)
    _, dense = np.unique(blocks, return_inverse=True)
    w = np.ones(len(blocks)) if weight is None else weight.astype(np.float64)
    one = np.zeros(len(blocks), dtype=np.int64)
    return compiled_loop()(dense.astype(np.int64), int(dense.max()) + 1, request.astype(np.int64), w, one)


@dataclass(frozen=True)
class Curve:
    """Tokens served against capacity (blocks): served(C) = sum of `tokens` over the steps whose
    `distance` is below C. `rate` 1.0: exact; below it, a SHARDS estimate from that share of the
    blocks."""

    distances: np.ndarray  # ascending, the finite prefix distances that serve tokens (scaled)
    tokens: np.ndarray  # cumulative tokens served up to and including each distance
    prompt_tokens: int
    rate: float = 1.0

    def served(self, capacity_blocks: int | np.ndarray) -> Any:
        """Tokens served at these capacities (blocks)."""
        i = np.searchsorted(self.distances, np.asarray(capacity_blocks), side="left")
        cum = np.r_[0, self.tokens]
        return cum[i]

    def share(self, capacity_blocks: int | np.ndarray) -> Any:
        """The share of prompt tokens served at these capacities."""
        return self.served(capacity_blocks) / self.prompt_tokens if self.prompt_tokens else np.nan


def curve(refs: References, rate: float = 1.0, seed: int = 0) -> Curve:
    """The capacity curve of a trace's references: exact (rate 1), or estimated from a sample
    (SHARDS, stratified): blocks referenced at least 1/rate times are kept whole, the others by
    the hash of their id at `rate`, each standing for 1/rate blocks in a distance and its tokens
    counting 1/rate times (normalised so that the sampled light blocks' tokens add up to all the
    light blocks' could). Keeping the heavy blocks whole is what holds the error on skewed traces:
    a shared system prompt's block, sampled or not, would move the whole curve."""
    if not 0 < rate <= 1:
        raise InputError(f"sampling rate: expected a number in (0, 1], got {rate}")
    if rate == 1:
        pd = prefix_distances(refs.blocks, refs.request)
        return _steps(pd, refs.serves.astype(np.float64), refs.prompt_tokens, rate)
    _, inverse, counts = np.unique(refs.blocks, return_inverse=True, return_counts=True)
    heavy = counts[inverse] >= 1 / rate
    keep = heavy | sampled(refs.blocks, rate, seed)
    weight = np.where(heavy[keep], 1.0, 1 / rate)
    pd = prefix_distances(refs.blocks[keep], refs.request[keep], weight)
    light_all = refs.serves[~heavy].sum()
    light_kept = refs.serves[keep & ~heavy].sum()
    scale = light_all / light_kept if light_kept else 0.0
    tokens = np.where(heavy[keep], 1.0, scale) * refs.serves[keep]
    return _steps(pd, tokens, refs.prompt_tokens, rate)


def _steps(pd: np.ndarray, tokens: np.ndarray, prompt_tokens: int, rate: float) -> Curve:
    """The curve of prefix distances and the tokens each reference serves."""
    finite = np.isfinite(pd) & (tokens > 0)
    order = np.argsort(pd[finite], kind="stable")
    dist = np.floor(pd[finite][order]).astype(np.int64)
    cum = np.cumsum(tokens[finite][order])
    ends = np.r_[np.flatnonzero(dist[1:] != dist[:-1]), len(dist) - 1] if len(dist) else np.zeros(0, dtype=np.int64)
    return Curve(dist[ends], cum[ends], prompt_tokens, rate)


def sampled(blocks: np.ndarray, rate: float, seed: int = 0) -> np.ndarray:
    """SHARDS' spatial sample: the references whose block's hash (`mixed`) falls below `rate` of
    SAMPLE_MODULUS. A sampled block keeps all its references."""
    return (mixed(blocks, seed) % np.uint64(SAMPLE_MODULUS)) < np.uint64(int(rate * SAMPLE_MODULUS))


def mixed(blocks: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 of each block id and the seed: a hash whose every bit depends on every bit of
    the id, so that its low bits pick blocks independently of how a trace numbers them."""
    with np.errstate(over="ignore"):
        z = blocks.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) * np.uint64(seed + 1)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def compiled(loop: Any, helpers: Sequence[Any] = ()) -> Any:
    """A sizing loop compiled by numba (the `sizing` extra), cached on disk. Its `helpers` are
    registered with numba first (`register_jitable`: the same functions, which numba then compiles
    where compiled code calls them), so that the loop calls them by name both ways."""
    try:
        import numba
        from numba.extending import register_jitable
    except ImportError:
        raise InputError("sizing needs numba: pip install 'kvbench[sizing]'") from None
    for helper in helpers:
        _jitable(register_jitable, helper)
    return numba.njit(cache=True, nogil=True)(loop)


@functools.cache
def _jitable(register: Any, helper: Any) -> None:
    """A helper registered with numba once a process, however many loops call it."""
    register(helper)


@functools.cache
def compiled_loop() -> Any:
    """The distance loop, compiled at its first use in a process."""
    return compiled(distance_loop, (fenwick_sum, fenwick_add))


def fenwick_sum(tree: np.ndarray, p: int) -> float:  # pragma: no cover
    """The weight at positions 0..p of a Fenwick tree (`tree[1:]`). (Run compiled.)"""
    total, i = 0.0, p + 1
    while i > 0:
        total += tree[i]
        i -= i & -i
    return total


def fenwick_add(tree: np.ndarray, p: int, w: float) -> None:  # pragma: no cover
    """Weight w added at position p of a Fenwick tree. (Run compiled.)"""
    i = p + 1
    while i < len(tree):
        tree[i] += w
        i += i & -i


def distance_loop(
    keys: np.ndarray, n_keys: int, request: np.ndarray, weight: np.ndarray, group: np.ndarray
) -> np.ndarray:  # pragma: no cover
    """Prefix distances of `keys` (dense ids below n_keys; `request`: each reference's request;
    `weight`: what each counts for; `group`: each reference's stream, each stream's references
    contiguous). A Fenwick tree holds each key's weight at its last touch; the distance of a touch
    is the weight after the key's previous one in its stream (a touch in an earlier stream is
    none: its mark lies before the stream's first position, where no distance reaches); a
    request's running maximum starts again at its first reference. (Run compiled;
    bench/sizing.py runs it as Python too.)"""
    n = len(keys)
    tree = np.zeros(n + 1, dtype=np.float64)
    last = np.full(n_keys, -1, dtype=np.int64)
    out = np.empty(n, dtype=np.float64)
    marked = 0.0
    running = 0.0
    stream = 0  # where the current stream began
    for t in range(n):
        if t == 0 or request[t] != request[t - 1]:
            running = 0.0
        if t > 0 and group[t] != group[t - 1]:
            stream = t
        k = keys[t]
        p = last[k]
        w = weight[t]
        if p < stream:
            running = np.inf
        else:
            running = max(running, marked - fenwick_sum(tree, p))
            fenwick_add(tree, p, -w)
            marked -= w
        out[t] = running
        fenwick_add(tree, t, w)
        marked += w
        last[k] = t
    return out


def knee(capacities: Sequence[int], shares: Sequence[float]) -> int | None:
    """The smallest of these capacities (each twice the one before) past which every doubling
    adds less than KNEE_GAIN to the share served: past the last doubling that still adds that
    much (a share may be flat before it rises: the knee is where it is flat for good); None if
    even the last one adds that much."""
    gains = [b - a >= KNEE_GAIN for a, b in itertools.pairwise(shares)]
    last = max((i for i, g in enumerate(gains) if g), default=-1)
    return None if last == len(gains) - 1 else capacities[last + 1]


def bin_edges() -> np.ndarray:
    """Each bin's first distance, then the last bin's end: exact one block at a time below
    EXACT_BINS, then BINS_PER_DOUBLING equal bins a doubling."""
    b = np.arange(BINS + 1, dtype=np.int64)
    octave = EXACT_OCTAVE + (b - EXACT_BINS) // BINS_PER_DOUBLING
    mantissa = BINS_PER_DOUBLING + (b - EXACT_BINS) % BINS_PER_DOUBLING
    return np.where(b < EXACT_BINS, b, mantissa << np.maximum(octave - DOUBLING_BITS, 0))


def bin_of(d: int) -> int:  # pragma: no cover
    """The bin of distance d (>= 0): `bin_edges`' inverse. (Run compiled.)"""
    if d < EXACT_BINS:
        return d
    octave, x = 0, d
    while x > 1:
        x >>= 1
        octave += 1
    within = (d >> (octave - DOUBLING_BITS)) - BINS_PER_DOUBLING  # the bits after the leading one
    return min(BINS - 1, EXACT_BINS + (octave - EXACT_OCTAVE) * BINS_PER_DOUBLING + within)


def stream_loop(
    blocks: np.ndarray,
    request: np.ndarray,
    serves: np.ndarray,
    heavy: np.ndarray,
    light_weight: float,
    start: int,
    shift: int,
    keys: np.ndarray,
    slot_of: np.ndarray,
    pos: np.ndarray,
    weight: np.ndarray,
    tree: np.ndarray,
    hist: np.ndarray,
    ints: np.ndarray,
    floats: np.ndarray,
) -> int:  # pragma: no cover
    """The kept references from `start` on, until the table is half full, the slots or the tree's
    positions run out (the index to go on from, after streamed.py's `Sample._grow`), or the end. As
    distance_loop, with a block's slot found by hashing its id. (Run compiled.)"""
    n, mask, size = len(blocks), len(keys) - 1, len(tree) - 1
    t, now, used = ints[0], ints[1], ints[2]
    marked, running = floats[0], floats[1]
    i = start
    while i < n and 2 * used < len(keys) and used < len(pos) and t < size:
        b = blocks[i]
        j = np.int64((np.uint64(b) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))
        while slot_of[j] >= 0 and keys[j] != b:
            j = (j + 1) & mask
        if slot_of[j] < 0:
            keys[j], slot_of[j] = b, used
            pos[used], weight[used] = -1, 1.0 if heavy[i] else light_weight
            used += 1
        s = slot_of[j]
        if request[i] != now:
            running, now = 0.0, request[i]
        w, p = weight[s], pos[s]
        if p < 0:
            running = np.inf
        else:
            running = max(running, marked - fenwick_sum(tree, p))
            fenwick_add(tree, p, -w)
            marked -= w
        if serves[i] > 0 and running < np.inf:
            hist[0 if heavy[i] else 1, bin_of(int(running))] += serves[i]
        fenwick_add(tree, t, w)
        marked += w
        pos[s] = t
        t += 1
        i += 1
    ints[0], ints[1], ints[2] = t, now, used
    floats[0], floats[1] = marked, running
    return i


def rehash(
    old_keys: np.ndarray, old_slots: np.ndarray, keys: np.ndarray, slot_of: np.ndarray, shift: int
) -> None:  # pragma: no cover
    """The table's entries put again into a larger one. (Run compiled.)"""
    mask = len(keys) - 1
    for e in range(len(old_keys)):
        j = np.int64((np.uint64(old_keys[e]) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))
        while slot_of[j] >= 0:
            j = (j + 1) & mask
        keys[j], slot_of[j] = old_keys[e], old_slots[e]


@functools.cache
def compiled_stream() -> Any:
    """The streamed distance loop (streamed.py), compiled at its first use in a process."""
    return compiled(stream_loop, (bin_of, fenwick_sum, fenwick_add))


@functools.cache
def compiled_rehash() -> Any:
    """The hash table's growth (streamed.py), compiled at its first use in a process."""
    return compiled(rehash)
