"""Which tier serves each prompt block of a fleet, from stack distances (pure; docs/sizing.md).

Each tier has a scope: one per worker, one per node (shared by its workers) or one for the cluster.
A tier's stream is the references of the requests routed to its worker, node or cluster, in time
order; its prefix distances are computed over that stream alone (`scoped_distances`). Tiers are
inclusive and write-through, each its own LRU (the emulator's and Dynamo's KVBM's way): every
block computed or loaded is written to every tier. A block is served by the fastest tier whose
prefix distance for it is below that tier's capacity; a block no tier holds is recomputed.

A tier that takes only what the tier above it evicts (`writes = "evicted"`, as the Dynamo mocker's
host memory does) is given, per request, the blocks that request's references push out of the
tier above and that it does not hold (`tokens_evicted`): what it must copy before the request
goes on. What it serves is counted as for the others.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.sizing.stack import References, compiled, compiled_loop

SCOPES = ("worker", "node", "cluster")


@dataclass(frozen=True)
class Fleet:
    workers: int
    workers_per_node: int

    def group(self, worker: np.ndarray, scope: str) -> np.ndarray:
        """The tier instance (its index within the scope) each worker reads."""
        if scope == "worker":
            return worker
        if scope == "node":
            return worker // self.workers_per_node
        return np.zeros_like(worker)


def streams(group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each reference's stream (`group`: the tier instance it reads) at 16 bits where the
    instances are fewer than 2^15 (numpy's radix sort sorts those, and the loops take them), and
    the order that lays the streams one after the other, each in time order."""
    narrow = group.astype(np.int16, copy=False) if group.max() <= np.iinfo(np.int16).max else group
    return narrow, np.argsort(narrow, kind="stable")


def scoped_distances(refs: References, group: np.ndarray) -> np.ndarray:
    """Prefix distances of every reference within its group's own stream (the references of that
    group, in time order): one pass, the groups laid one after the other and their blocks kept
    apart, so that no distance counts another group's touches."""
    if not len(group):
        return np.zeros(0, dtype=np.float64)
    if (group == group[0]).all():  # one stream (a cluster's tier): in time order already
        return refs.distances
    dense, n_keys = refs.dense
    ones = np.broadcast_to(np.float64(1.0), len(group))  # (as References.distances weighs them)
    narrow, order = streams(group)
    out = np.empty(len(order), dtype=np.float64)
    # requests stay contiguous within a group (all of a request's references go to one worker)
    out[order] = compiled_loop()(dense[order], n_keys, refs.request[order], ones, narrow[order])
    return out


def served_by(distances: Sequence[np.ndarray], capacities: Sequence[float]) -> np.ndarray:
    """Per reference, the index of the fastest tier that serves it (tiers fastest first, each
    with its scoped prefix distances and its capacity in blocks), or len(tiers): recomputed.
    (8 bits: a sizing of 10^7 requests has some 2x10^8 references; config.py allows few tiers.)"""
    n = len(distances[0]) if distances else 0
    out = np.full(n, len(distances), dtype=np.int8 if len(distances) < np.iinfo(np.int8).max else np.int64)
    for k in range(len(distances) - 1, -1, -1):  # the fastest last: it overrides the slower
        out[distances[k] < capacities[k]] = k
    return out


def tokens_by_tier(refs: References, tier: np.ndarray, tiers: int) -> np.ndarray:
    """Prompt tokens each tier serves (the last entry: the tokens computed, the prompts' whole
    rest included), from `served_by`'s answer."""
    served = np.bincount(tier, weights=refs.serves, minlength=tiers + 1)[:tiers]
    return np.r_[served, refs.prompt_tokens - served.sum()]


def tokens_per_request(refs: References, tier: np.ndarray, tiers: int) -> np.ndarray:
    """The prompt tokens each tier serves each request (a row per request, a column per tier),
    from `served_by`'s answer: one compiled pass (numpy's masks, gathers and count over the
    (request, tier) pairs took 11 s for 10^7 requests)."""
    return compiled_tallies()[0](tier, refs.request, refs.serves, refs.requests, tiers)


def tokens_written(refs: References, distance: np.ndarray, capacity: int, block_tokens: int) -> np.ndarray:
    """The prompt tokens each request writes into a tier (its scoped distances, its capacity in
    blocks): those of its blocks the tier did not hold (write-through: every block referenced is
    inserted where it misses), each block whole (the prompt's last, which serves no token, is
    written whole too), in one compiled pass, as the tiers' own tokens are counted (numpy's mask
    and weighted count hold a copy of the references a tier misses)."""
    return compiled_tallies()[2](distance, refs.request, refs.requests, float(capacity), block_tokens)


def tokens_evicted(
    refs: References, instance: np.ndarray, tier: np.ndarray, capacity: int, k: int, block_tokens: int
) -> np.ndarray:
    """The prompt tokens each request's references evict from tier k - 1 (`instance`: the
    instance of it each request reads; `capacity`: its capacity in blocks) that tier k does not
    hold: the blocks that entered tier k - 1 computed or loaded from a tier slower than k (`tier`,
    which tier served each reference: served_by), which a tier taking what the one above evicts
    must be copied. One that came from tier k is held there; one that came from a faster tier
    than k - 1 (a worker's G1 above a node's G2) passed through tier k - 1 before, and was copied
    when it left it. An LRU of the tier above per instance, simulated over its stream in one
    compiled pass; a block is in it exactly when its stack distance is below the capacity, as
    the distances say."""
    if not refs.requests or not len(refs.blocks):
        return np.zeros(refs.requests, dtype=np.int64)
    dense, n_keys = refs.dense
    narrow, order = streams(instance[refs.request])
    keys, request, served, stream = dense[order], refs.request[order], tier[order], narrow[order]
    return compiled_tallies()[3](keys, n_keys, request, served, stream, capacity, k, block_tokens, refs.requests)


def curve_tallies(
    distance: np.ndarray, tier: np.ndarray, serves: np.ndarray, beyond: np.ndarray | None, caps: np.ndarray, k: int
) -> tuple[float, np.ndarray, np.ndarray]:
    """What tier k's capacity curve needs, in one compiled pass over the references (numpy's
    masks and searchsorted took 6 s a tier at 10^7 requests): the tokens faster tiers serve; and
    of the references no faster tier serves, the tokens whose distance in tier k first falls
    below caps[i] (ascending; index len(caps): none of them), all of them (`own`) and those a
    slower tier holds too (`taken`; `beyond`: whether one does, None where none is slower)."""
    return compiled_tallies()[1](distance, tier, serves, beyond, caps, k)


@functools.cache
def compiled_tallies() -> tuple[Any, Any, Any, Any]:
    """The tallies, compiled at their first use in a process."""
    return compiled(tier_tally), compiled(curve_tally), compiled(written_tally), compiled(evicted_tally)


def tier_tally(
    tier: np.ndarray, request: np.ndarray, serves: np.ndarray, requests: int, tiers: int
) -> np.ndarray:  # pragma: no cover
    """tokens_per_request's pass. (Run compiled; the tests run it as Python too.)"""
    out = np.zeros((requests, tiers), dtype=np.int64)
    for r in range(len(tier)):
        if tier[r] < tiers:
            out[request[r], tier[r]] += serves[r]
    return out


def written_tally(
    distance: np.ndarray, request: np.ndarray, requests: int, capacity: float, block_tokens: int
) -> np.ndarray:  # pragma: no cover
    """tokens_written's pass. (Run compiled; the tests run it as Python too.)"""
    out = np.zeros(requests, dtype=np.int64)
    for r in range(len(distance)):
        if distance[r] >= capacity:
            out[request[r]] += block_tokens
    return out


def curve_tally(
    distance: np.ndarray, tier: np.ndarray, serves: np.ndarray, beyond: np.ndarray | None, caps: np.ndarray, k: int
) -> tuple[float, np.ndarray, np.ndarray]:  # pragma: no cover
    """curve_tallies' pass. Sums of whole tokens: exact in any order. (Run compiled; the tests run
    it as Python too.)"""
    m = len(caps)
    own, taken, faster = np.zeros(m + 1), np.zeros(m + 1), 0.0
    for r in range(len(distance)):
        if tier[r] < k:
            faster += serves[r]
            continue
        b = 0
        while b < m and caps[b] <= distance[r]:
            b += 1
        own[b] += serves[r]
        if beyond is not None and beyond[r]:
            taken[b] += serves[r]
    return faster, own, taken


def evicted_tally(
    keys: np.ndarray,
    n_keys: int,
    request: np.ndarray,
    tier: np.ndarray,
    group: np.ndarray,
    capacity: int,
    k: int,
    block_tokens: int,
    requests: int,
) -> np.ndarray:  # pragma: no cover
    """tokens_evicted's pass over the streams of tier k - 1 (`group`: each reference's instance,
    each stream contiguous and in time order): a doubly linked list per stream, most recent first
    (`after`, `before`), of at most `capacity` blocks; a block is resident in the stream numbered
    `resident[key]` and dirty when it entered from no tier as fast as k. (Run compiled; the tests run
    it as Python too.)"""
    out = np.zeros(requests, dtype=np.int64)
    after = np.full(n_keys, -1, dtype=np.int64)
    before = np.full(n_keys, -1, dtype=np.int64)
    resident = np.full(n_keys, -1, dtype=np.int64)
    dirty = np.zeros(n_keys, dtype=np.bool_)
    head, tail, size, stream = -1, -1, 0, 0
    for t in range(len(keys)):
        if t > 0 and group[t] != group[t - 1]:  # the next instance's stream: its cache starts empty
            head, tail, size, stream = -1, -1, 0, stream + 1
        key = keys[t]
        if resident[key] == stream:
            if key == head:
                continue
            b, a = before[key], after[key]  # out of its place (it is not the head: b >= 0)
            after[b] = a
            if a >= 0:
                before[a] = b
            else:
                tail = b
        else:
            resident[key], dirty[key] = stream, tier[t] > k
            size += 1
            if tail < 0:
                tail = key
        before[key], after[key] = -1, head  # to the front
        if head >= 0:
            before[head] = key
        head = key
        if size > capacity:  # its least recently used block out (the new one itself, at 0 blocks)
            e = tail
            tail = before[e]
            if tail >= 0:
                after[tail] = -1
            else:
                head = -1
            resident[e] = -1
            size -= 1
            if dirty[e]:
                out[request[t]] += block_tokens
    return out
