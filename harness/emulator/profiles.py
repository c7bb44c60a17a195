"""Emulator profiles: the cost model and its calibration, in the open.

Model (all times in model seconds; the server divides them by its time scale):
- Prefill of a prompt of n tokens whose first p tokens are cached costs T(n) - T(p), with
  T(n) = a*n + b*n**2 (linear MLP work plus quadratic attention). One GPU: prefills are
  serialized in arrival order.
- Cached blocks held by a tier other than G1 are first loaded: latency + bytes / bandwidth,
  bytes = blocks * block_tokens * kv_bytes_per_token. Loads through one tier share its bandwidth
  (first come, first served); a load does not occupy the GPU.
- Decode emits one token every `itl_s`, independent of batch size; reasoning models emit
  `reasoning_tokens` reasoning tokens first.

Calibration of `redbooks-g4`, to the published figures only (IBM Redbooks MD260021, read from
harness/reference/redbooks-md260021.toml):
- a, b solved exactly through the no-cache TTFT points (10,000 tokens, 0.572 s) and
  (130,000 tokens, 32.14 s).
- G4 latency and bandwidth solved exactly so that a fully cached prompt (all blocks but the last
  one loaded from G4, the last block recomputed) gives 0.193 s at 10,000 and 0.57 s at 130,000
  tokens, with gpt-oss-120b's 73,728 KV bytes per token. This gives about 23 GB/s: the rate one
  request achieved, not the storage system's aggregate bandwidth.
- The effect of competing traffic: loads get min(per-client rate, backend - competing); the
  backend figure is fitted to the published drop (see G4_BACKEND_BYTES_PER_S).
- Not published, so assumed (and not fitted to any test): inter-token latency 20 ms, 16 reasoning
  tokens before content (gpt-oss reasons first), 16-token blocks (vLLM's default), G4 capacity
  500 TB, G1/G2/G3 disabled as in the paper's TTFT test.

`tiered` keeps that model and that G4, and puts two smaller tiers in front, so that context
that left the GPU comes back from host memory, from storage, or not at all. Every value of those
two tiers is ASSUMED (TIERED_G1, TIERED_G2 below), not published: G1 is the GPU memory left for
KV (16 GB), G2 host memory (24 GB) read at 50 GB/s (PCIe 5 x16) after 1 ms. New KV is written to
every tier (write-through, as Dynamo's KVBM offloads), each tier evicts least-recently-used
blocks, and a lookup takes each block from the fastest tier holding it: a block evicted from G1
is found in G2 while G2 still holds it, else in G4.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cache

from harness.config.reference import redbooks
from harness.config.scenario import EMULATOR_PROFILES
from harness.emulator.kvcache import Tier

RECOMPUTE, REDBOOKS_G4, TIERED = EMULATOR_PROFILES

# Aggregate bandwidth of the G4 storage system as this model sees it, shared between one client's
# KV loads and competing traffic. Not published: FITTED so that the paper's 200 GB/s of competing
# traffic (four clients) takes the cached concurrency run from 4.26 to about 3.6 req/s
# (scenarios/redbooks-competing-traffic.toml, on this emulator). It is a model parameter, not a
# claim about Storage Scale's real aggregate throughput.
G4_BACKEND_BYTES_PER_S = 214.7e9
# The `tiered` profile's tiers in front of G4: ASSUMED values, see the module's docstring.
TIERED_G1 = {"capacity_bytes": 16e9, "read_bytes_per_s": math.inf, "latency_s": 0.0}
TIERED_G2 = {"capacity_bytes": 24e9, "read_bytes_per_s": 50e9, "latency_s": 0.001}


@dataclass(frozen=True)
class TierSpec:
    name: str
    capacity_bytes: float
    read_bytes_per_s: float  # what one client's loads achieve
    latency_s: float
    # The storage system's aggregate bandwidth, shared with competing traffic: a client's loads
    # get min(read_bytes_per_s, backend - competing). None: competing traffic has no effect.
    backend_bytes_per_s: float | None = None

    def effective_read(self, competing_bytes_per_s: float) -> float:
        if self.backend_bytes_per_s is None or competing_bytes_per_s <= 0:
            return self.read_bytes_per_s
        left = max(self.backend_bytes_per_s - competing_bytes_per_s, 0.02 * self.backend_bytes_per_s)
        return min(self.read_bytes_per_s, left)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model_id: str
    max_model_len: int
    kv_bytes_per_token: int
    block_tokens: int
    prefill_a: float  # s / token
    prefill_b: float  # s / token^2
    itl_s: float
    reasoning_tokens: int
    reasoning_field: str
    tiers: tuple[TierSpec, ...]  # enabled tiers only, fastest first

    def prefill_s(self, n: int) -> float:
        return self.prefill_a * n + self.prefill_b * n * n

    def compute_s(self, n: int, cached: int) -> float:
        return self.prefill_s(n) - self.prefill_s(cached)

    def load_s(self, tier: TierSpec, blocks: int, competing_bytes_per_s: float = 0.0) -> float:
        bw = tier.effective_read(competing_bytes_per_s)
        return tier.latency_s + blocks * self.block_tokens * self.kv_bytes_per_token / bw

    def make_tiers(self) -> list[Tier]:
        block_bytes = self.block_tokens * self.kv_bytes_per_token
        return [Tier(t.name, int(t.capacity_bytes // block_bytes), t.read_bytes_per_s, t.latency_s) for t in self.tiers]


def _solve2(a1: float, b1: float, c1: float, a2: float, b2: float, c2: float) -> tuple[float, float]:
    """x, y with a1*x + b1*y = c1 and a2*x + b2*y = c2."""
    det = a1 * b2 - a2 * b1
    return (c1 * b2 - c2 * b1) / det, (a1 * c2 - a2 * c1) / det


@cache
def _redbooks_fit() -> dict[str, float]:
    ref = redbooks()
    kv = int(ref["model_kv"]["kv_bytes_per_token"])
    n1, n2 = int(ref["ttft"]["prompt_tokens_min"]), int(ref["ttft"]["prompt_tokens_max"])
    t1, t2 = float(ref["ttft"]["no_cache_s"][str(n1)]), float(ref["ttft"]["no_cache_s"][str(n2)])
    a, b = _solve2(n1, n1 * n1, t1, n2, n2 * n2, t2)
    block = 16

    def t(n: int) -> float:
        return a * n + b * n * n

    w1, w2 = (float(x) for x in ref["ttft"]["cached_s_range"])
    # Cached TTFT(n) = latency + loaded_tokens * kv / bw + T(n) - T(loaded): solve latency, 1/bw.
    l1, l2 = ((n - 1) // block * block for n in (n1, n2))
    latency, inv_bw = _solve2(1.0, l1 * kv, w1 - (t(n1) - t(l1)), 1.0, l2 * kv, w2 - (t(n2) - t(l2)))
    return {"a": a, "b": b, "kv": kv, "block": block, "g4_latency": latency, "g4_bw": 1.0 / inv_bw}


def _gpt_oss(name: str, description: str, tiers: tuple[TierSpec, ...]) -> Profile:
    fit = _redbooks_fit()
    return Profile(
        name=name,
        description=description,
        model_id="openai/gpt-oss-120b",
        max_model_len=131072,
        kv_bytes_per_token=int(fit["kv"]),
        block_tokens=int(fit["block"]),
        prefill_a=fit["a"],
        prefill_b=fit["b"],
        itl_s=0.020,
        reasoning_tokens=16,
        reasoning_field="reasoning_content",
        tiers=tiers,
    )


@cache
def profiles() -> dict[str, Profile]:
    fit = _redbooks_fit()
    g4 = TierSpec("G4", 500e12, fit["g4_bw"], fit["g4_latency"], G4_BACKEND_BYTES_PER_S)
    return {
        p.name: p
        for p in (
            _gpt_oss(
                REDBOOKS_G4,
                "gpt-oss-120b on one GPU, KV cache on shared storage only (G1, G2 off), "
                "calibrated to IBM Redbooks MD260021",
                (g4,),
            ),
            _gpt_oss(RECOMPUTE, "the same model with no KV cache at all: every prompt is recomputed", ()),
            _gpt_oss(
                TIERED,
                "the redbooks-g4 model and G4 behind a 16 GB G1 (GPU) and a 24 GB G2 (host memory), "
                "LRU each (assumed sizes and speeds)",
                (TierSpec("G1", **TIERED_G1), TierSpec("G2", **TIERED_G2), g4),
            ),
        )
    }


def with_capacities(profile: Profile, blocks: dict[str, int]) -> Profile:
    """The profile with these tiers' capacities set in blocks (a scenario's
    `[emulator] capacity_blocks`); a tier the profile does not have is a ValueError."""
    known = {t.name for t in profile.tiers}
    if unknown := sorted(set(blocks) - known):
        raise ValueError(
            f"profile {profile.name} has no tier {unknown[0]} (its tiers: {', '.join(sorted(known)) or 'none'})"
        )
    size = profile.block_tokens * profile.kv_bytes_per_token
    tiers = tuple(replace(t, capacity_bytes=blocks[t.name] * size) if t.name in blocks else t for t in profile.tiers)
    return replace(profile, tiers=tiers)


def get_profile(name: str) -> Profile:
    try:
        return profiles()[name]
    except KeyError:
        raise KeyError(f"unknown emulator profile {name!r}; known: {', '.join(sorted(profiles()))}") from None
