"""Prometheus text exposition of the emulator's counters, named after vLLM and Dynamo KVBM so
that the same metric maps serve the emulator and real stacks."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.emulator.kvcache import KVCache

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)


@dataclass
class Counters:
    requests: int = 0
    request_errors: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    query_tokens: int = 0  # prompt tokens looked up in the prefix cache
    g1_hit_tokens: int = 0
    external_hit_tokens: int = 0  # from G2..G4
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: int = 0

    def observe_ttft(self, seconds: float) -> None:
        self.ttft_sum += seconds
        self.ttft_count += 1
        for i, le in enumerate(TTFT_BUCKETS):
            if seconds <= le:
                self.ttft_counts[i] += 1


class _Exposition:
    def __init__(self, model: str) -> None:
        self.lines: list[str] = []
        self.lbl = f'model_name="{model}"'

    def metric(self, name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for suffix_labels, value in samples:
            self.lines.append(f"{name}{suffix_labels} {value}")

    def counter(self, name: str, help_: str, value: float) -> None:
        self.metric(name, "counter", help_, [("_total{" + self.lbl + "}", value)])


def render(c: Counters, cache: KVCache, model: str) -> str:
    x = _Exposition(model)
    _vllm(x, c, cache)
    _kvbm(x, c, cache)
    return "\n".join(x.lines) + "\n"


def _vllm(x: _Exposition, c: Counters, cache: KVCache) -> None:
    counter, metric, lbl = x.counter, x.metric, x.lbl
    counter("vllm:request_success", "Finished requests.", c.requests)
    counter("kvbench_emulator:request_errors", "Requests that failed.", c.request_errors)
    counter("vllm:prompt_tokens", "Prompt tokens processed.", c.prompt_tokens)
    counter("vllm:generation_tokens", "Tokens generated.", c.generation_tokens)
    counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the GPU prefix cache.", c.query_tokens)
    counter("vllm:prefix_cache_hits", "Prompt tokens found in the GPU prefix cache (G1).", c.g1_hit_tokens)
    counter(
        "vllm:external_prefix_cache_queries",
        "Prompt tokens looked up in the external KV tiers.",
        c.query_tokens,
    )
    counter(
        "vllm:external_prefix_cache_hits",
        "Prompt tokens loaded from an external KV tier (G2-G4).",
        c.external_hit_tokens,
    )
    metric(
        "vllm:time_to_first_token_seconds",
        "histogram",
        "Server-side time to first token (model time).",
        [
            *((f'_bucket{{{lbl},le="{le}"}}', n) for le, n in zip(TTFT_BUCKETS, c.ttft_counts, strict=True)),
            (f'_bucket{{{lbl},le="+Inf"}}', c.ttft_count),
            (f"_sum{{{lbl}}}", c.ttft_sum),
            (f"_count{{{lbl}}}", c.ttft_count),
        ],
    )
    # as vLLM publishes its cache's configuration: the block size is what the warm check needs
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig.",
        [(f'{{block_size="{cache.block_tokens}",enable_prefix_caching="True"}}', 1.0)],
    )


def _kvbm(x: _Exposition, c: Counters, cache: KVCache) -> None:
    metric = x.metric
    tiers = {t.name: t for t in cache.tiers}

    def blocks(*names: str, attr: str) -> int:
        return sum(getattr(tiers[n], attr) for n in names if n in tiers)

    kvbm = (
        ("kvbm_offload_blocks_d2h", "Blocks offloaded from GPU to host memory (G2).", ("G2",), "offloaded_blocks"),
        (
            "kvbm_offload_blocks_d2d",
            "Blocks offloaded from GPU to disk or storage (G3, G4).",
            ("G3", "G4"),
            "offloaded_blocks",
        ),
        ("kvbm_onboard_blocks_h2d", "Blocks onboarded from host memory (G2) to GPU.", ("G2",), "onboarded_blocks"),
        (
            "kvbm_onboard_blocks_d2d",
            "Blocks onboarded from disk or storage (G3, G4) to GPU.",
            ("G3", "G4"),
            "onboarded_blocks",
        ),
    )
    for name, help_, names, attr in kvbm:
        metric(name, "counter", help_, [("", blocks(*names, attr=attr))])
    metric("kvbm_matched_tokens", "counter", "Prompt tokens matched in the KVBM tiers.", [("", c.external_hit_tokens)])
    for name, help_, attr in (
        ("kvbench_emulator_tier_hit_tokens", "Prompt tokens served by each tier.", "hit_tokens"),
        ("kvbench_emulator_tier_offloaded_blocks", "Blocks written to each tier.", "offloaded_blocks"),
        ("kvbench_emulator_tier_onboarded_blocks", "Blocks read from each tier to the GPU.", "onboarded_blocks"),
        ("kvbench_emulator_tier_evicted_blocks", "Blocks evicted from each tier (LRU).", "evicted_blocks"),
    ):
        metric(name, "counter", help_, [(f'_total{{tier="{t.name}"}}', getattr(t, attr)) for t in cache.tiers])
    metric(
        "kvbench_emulator_tier_blocks",
        "gauge",
        "Blocks held by each tier.",
        [(f'{{tier="{t.name}"}}', len(t.blocks)) for t in cache.tiers],
    )
