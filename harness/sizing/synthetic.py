"""Synthetic fleet workloads with known reuse, as block references (pure): traces far larger than a
file of JSON lines holds comfortably, for the sizing benchmarks and the tests of the sampled
curves (docs/sizing.md).

`shared_documents`: each request reads a prefix of one of `documents` shared documents (its
popularity Zipf-distributed with exponent `alpha`), a length uniform between one block and the
whole document, then `own_blocks` blocks of its own (the question, the conversation so far) that
no other request shares. Block ids are dense: document d's block k is d * doc_blocks + k; own
blocks follow all documents'.

`chunks`: references cut into pieces of so many requests, as a trace file streams.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from harness.sizing.stack import References


def shared_documents(
    requests: int, documents: int, doc_blocks: int, own_blocks: int, alpha: float, block_tokens: int, seed: int = 0
) -> References:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, documents + 1, dtype=np.float64) ** alpha
    doc = rng.choice(documents, size=requests, p=weights / weights.sum())
    shared = rng.integers(1, doc_blocks + 1, size=requests)
    per_request = shared + own_blocks
    total = int(per_request.sum())
    request = np.repeat(np.arange(requests, dtype=np.int32), per_request)
    starts = np.cumsum(per_request) - per_request
    position = np.arange(total, dtype=np.int64) - np.repeat(starts, per_request)
    in_doc = position < np.repeat(shared, per_request)
    own = np.arange(total, dtype=np.int64) + documents * doc_blocks  # unique to each reference
    blocks = np.where(in_doc, np.repeat(doc * doc_blocks, per_request) + position, own)
    # every block but the last is served when it hits (the prompt fills all of them)
    serves = np.where(position < np.repeat(per_request - 1, per_request), block_tokens, 0).astype(np.int32)
    return References(blocks, request, serves, total * block_tokens, requests)


def chunks(refs: References, requests: int) -> Iterator[References]:
    """The references cut into pieces of `requests` requests, each numbered from 0 and the prompt
    tokens all in the first: what `kvbench trace curve` streams from a file."""
    cuts = np.searchsorted(refs.request, np.arange(0, refs.requests + requests, requests))
    for a, b in itertools.pairwise(cuts):
        if a < b:
            first, last = int(refs.request[a]), int(refs.request[b - 1])
            yield References(
                refs.blocks[a:b],
                refs.request[a:b] - first,
                refs.serves[a:b],
                refs.prompt_tokens if a == 0 else 0,
                last - first + 1,
            )
