"""KV blocks in tiers G1 (GPU) .. G4 (shared storage): prefix matching on chained block hashes,
LRU eviction per tier, and the counters a real stack would export."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(tokens: Sequence[str], block_tokens: int, salt: str | None = None) -> list[int]:
    """Chained hashes of the full blocks: a block's hash covers every token before it, so equal
    hashes mean equal prefixes. A cache salt changes the whole chain (as vLLM's `cache_salt`)."""
    out: list[int] = []
    h = hash(("kvbench-root", salt))
    for i in range(0, len(tokens) - block_tokens + 1, block_tokens):
        h = hash((h, tuple(tokens[i : i + block_tokens])))
        out.append(h)
    return out


@dataclass
class Tier:
    name: str
    capacity_blocks: int
    read_bytes_per_s: float  # inf for G1: KV already on the GPU
    latency_s: float
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)
    hit_tokens: int = 0
    offloaded_blocks: int = 0
    onboarded_blocks: int = 0
    evicted_blocks: int = 0

    def __contains__(self, h: int) -> bool:
        return h in self.blocks

    def put(self, h: int) -> bool:
        """Insert or refresh a block; True when it was new to this tier."""
        if h in self.blocks:
            self.blocks.move_to_end(h)
            return False
        self.blocks[h] = None
        if len(self.blocks) > self.capacity_blocks:
            self.blocks.popitem(last=False)
            self.evicted_blocks += 1
        return True


@dataclass(frozen=True)
class Match:
    cached_tokens: int  # tokens whose KV need not be computed
    load_blocks: dict[str, int]  # tier name -> blocks to move to the GPU (not G1)
    g1_blocks: int


class KVCache:
    def __init__(self, tiers: list[Tier], block_tokens: int) -> None:
        self.tiers = tiers  # fastest first
        self.block_tokens = block_tokens

    def lookup(self, hashes: list[int], prompt_tokens: int) -> Match:
        """Longest cached prefix across the tiers, each block served by the fastest tier holding it.
        At least one prompt token is always computed (it yields the first output token)."""
        usable = min(len(hashes), (prompt_tokens - 1) // self.block_tokens)
        load: dict[str, int] = {}
        g1 = 0
        for h in hashes[:usable]:
            for tier in self.tiers:
                if h in tier:
                    tier.blocks.move_to_end(h)
                    if tier.name == "G1":
                        g1 += 1
                    else:
                        load[tier.name] = load.get(tier.name, 0) + 1
                    tier.hit_tokens += self.block_tokens
                    break
            else:
                break
        for name, n in load.items():
            self.tier(name).onboarded_blocks += n
        cached_blocks = g1 + sum(load.values())
        return Match(cached_blocks * self.block_tokens, load, g1)

    def store(self, hashes: list[int], match: Match | None = None) -> None:
        """New KV is kept on the GPU (when G1 is on) and offloaded to every other enabled tier.
        A tier that served the whole matched prefix already holds it (and lookup refreshed it)."""
        matched = match.cached_tokens // self.block_tokens if match else 0
        for tier in self.tiers:
            served = (
                match.g1_blocks
                if match and tier.name == "G1"
                else (match.load_blocks.get(tier.name, 0) if match else 0)
            )
            for h in hashes[matched if served == matched else 0 :]:
                if tier.put(h):
                    tier.offloaded_blocks += 1

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    def reset(self) -> None:
        for tier in self.tiers:
            tier.blocks.clear()
