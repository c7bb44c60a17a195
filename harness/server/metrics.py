"""Server-side counters (Prometheus /metrics): parse, take per-phase deltas, and map raw metrics
of known servers to kvbench figures. Pure functions; the scraping lives in scrape.py.

Counters are cumulative, so every figure is a delta between a snapshot before and after the
requests of a phase. Gauges (e.g. KVBM hit rates) are reported as their value after the phase.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)
Snapshot = dict[Key, float]

# (family, name, numerator, denominator, how) for the hit ratios a server reports
RATIOS: tuple[tuple[str, str, str, str], ...] = (
    ("vllm", "prefix_cache_hit_ratio", "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    (
        "vllm",
        "external_prefix_cache_hit_ratio",
        "vllm:external_prefix_cache_hits_total",
        "vllm:external_prefix_cache_queries_total",
    ),
    ("lmcache", "lmcache_hit_ratio", "lmcache:num_hit_tokens_total", "lmcache:num_requested_tokens_total"),
    # Dynamo's frontend: histograms of each request's cached and prompt tokens; their sums count
    (
        "dynamo-frontend",
        "dynamo_frontend_hit_ratio",
        "dynamo_frontend_cached_tokens_sum",
        "dynamo_frontend_input_sequence_tokens_sum",
    ),
    # its KV router: the prompt tokens it expected to find cached on the worker it chose (what the
    # workers then report is the frontend's ratio above)
    (
        "dynamo-router",
        "dynamo_router_kv_hit_ratio",
        "dynamo_component_router_kv_selected_cached_prefix_tokens_total",
        "dynamo_component_router_input_sequence_tokens_sum",
    ),
)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("vllm", "prompt_tokens", "vllm:prompt_tokens_total"),
    ("vllm", "prefix_cache_hit_tokens", "vllm:prefix_cache_hits_total"),
    ("vllm", "external_hit_tokens", "vllm:external_prefix_cache_hits_total"),
    ("dynamo-kvbm", "kvbm_matched_tokens", "kvbm_matched_tokens"),
    ("dynamo-kvbm", "kvbm_offload_blocks_d2h", "kvbm_offload_blocks_d2h"),
    ("dynamo-kvbm", "kvbm_offload_blocks_h2d", "kvbm_offload_blocks_h2d"),
    ("dynamo-kvbm", "kvbm_offload_blocks_d2d", "kvbm_offload_blocks_d2d"),
    ("dynamo-kvbm", "kvbm_onboard_blocks_h2d", "kvbm_onboard_blocks_h2d"),
    ("dynamo-kvbm", "kvbm_onboard_blocks_d2d", "kvbm_onboard_blocks_d2d"),
    # a counter in earlier Dynamo releases, a histogram of each request's since (1.6: its sum counts)
    ("dynamo-frontend", "dynamo_cached_tokens", "dynamo_frontend_cached_tokens"),
    ("dynamo-frontend", "dynamo_cached_tokens", "dynamo_frontend_cached_tokens_sum"),
    (
        "dynamo-router",
        "dynamo_router_selected_cached_tokens",
        "dynamo_component_router_kv_selected_cached_prefix_tokens_total",
    ),
    ("lmcache", "lmcache_hit_tokens", "lmcache:num_hit_tokens_total"),
    ("llama.cpp", "llamacpp_prompt_tokens_processed", "llamacpp:prompt_tokens_total"),
    ("llama.cpp", "llamacpp_tokens_predicted", "llamacpp:tokens_predicted_total"),
)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("dynamo-kvbm", "kvbm_host_cache_hit_rate", "kvbm_host_cache_hit_rate"),
    ("dynamo-kvbm", "kvbm_disk_cache_hit_rate", "kvbm_disk_cache_hit_rate"),
    ("lmcache", "lmcache_retrieve_hit_rate", "lmcache:retrieve_hit_rate"),
)
# The server's first-token time: Dynamo's frontend's where it is scraped (the nearest the client:
# routing and tokenizing included), else vLLM's (a vLLM server, or Dynamo's workers alone)
TTFT_HISTOGRAMS = ("dynamo_frontend_time_to_first_token_seconds", "vllm:time_to_first_token_seconds")
WORKER_TTFT = "vllm:time_to_first_token_seconds"


def block_size(snap: Snapshot) -> tuple[int, str] | None:
    """The KV block size a server publishes, and the metric that said it: vLLM's
    `vllm:cache_config_info{block_size=...}`, Dynamo's frontend
    `dynamo_frontend_model_kv_cache_block_size` (its workers')."""
    for (name, labels), value in snap.items():
        if name == "vllm:cache_config_info":
            got = dict(labels).get("block_size", "")
            if got.isdigit() and int(got) > 0:
                return int(got), name
        if name == "dynamo_frontend_model_kv_cache_block_size" and value >= 1 and value.is_integer():
            return int(value), name
    return None


def parse(text: str) -> tuple[Snapshot, set[str]]:
    """Every sample of a Prometheus text exposition, and the names of the gauges."""
    out: Snapshot = {}
    gauges: set[str] = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
            if family.type == "gauge":
                gauges.add(s.name)
    return out, gauges


def _sum(snap: Snapshot, name: str, value: str | None = None, label: str = "tier") -> float | None:
    """Sum over label sets (those whose `label` is `value`, when given). The parser names every
    counter sample ..._total (Dynamo's KVBM counters have no such suffix on the wire), so either
    spelling matches."""
    names = {name, name + "_total"}
    values = [v for (n, labels), v in snap.items() if n in names and (value is None or (label, value) in labels)]
    return sum(values) if values else None


# vLLM's per-source counters (0.32+): where cached prompt tokens came from ("device", "host",
# "p2p", "disk"), and how every prompt token was had ("local_compute", "local_cache_hit",
# "external_kv_transfer")
BY_SOURCE = (
    ("cached_tokens_by_source", "vllm:prompt_tokens_cached_by_source_total"),
    ("prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total"),
)


def delta(before: Snapshot, after: Snapshot, gauges: Iterable[str] = ()) -> Snapshot:
    """after - before for counters (a counter that went down was reset: its after value counts);
    gauges keep their value after."""
    gauge_names = set(gauges)
    out: Snapshot = {}
    for key, v in after.items():
        if key[0] in gauge_names:
            out[key] = v
            continue
        b = before.get(key, 0.0)
        out[key] = v - b if v >= b else v
    return out


def add(total: Snapshot, d: Snapshot, gauges: Iterable[str] = ()) -> Snapshot:
    gauge_names = set(gauges)
    for key, v in d.items():
        total[key] = v if key[0] in gauge_names else total.get(key, 0.0) + v
    return total


def mapped(d: Snapshot, prompt_tokens_sent: int | None = None) -> dict[str, Any]:
    """kvbench figures from one phase's deltas, for every server family whose metrics appear."""
    out: dict[str, Any] = {}
    families: set[str] = set()
    for fam, name, num, den in RATIOS:
        n, q = _sum(d, num), _sum(d, den)
        if n is not None and q is not None:
            families.add(fam)
            out[name] = n / q if q > 0 else None
    for fam, name, metric in COUNTERS + GAUGES:
        v = _sum(d, metric)
        if v is not None:
            families.add(fam)
            out[name] = v
    tiers = sorted({dict(labels).get("tier", "") for (n, labels) in d if n == "kvbench_emulator_tier_hit_tokens_total"})
    if tiers:
        families.add("kvbench-emulator")
        out["tier_hit_tokens"] = {t: _sum(d, "kvbench_emulator_tier_hit_tokens_total", t) for t in tiers}
        out["tier_onboarded_blocks"] = {t: _sum(d, "kvbench_emulator_tier_onboarded_blocks_total", t) for t in tiers}
        out["tier_offloaded_blocks"] = {t: _sum(d, "kvbench_emulator_tier_offloaded_blocks_total", t) for t in tiers}
    for name, metric in BY_SOURCE:
        names = {metric, metric + "_total"}
        sources = sorted({dict(labels).get("source", "") for (n, labels) in d if n in names})
        if sources:
            families.add("vllm")
            out[name] = {src: _sum(d, metric, src, "source") for src in sources}
    # llama.cpp counts only the prompt tokens it computed: the rest came from its cache.
    processed = out.get("llamacpp_prompt_tokens_processed")
    if processed is not None and prompt_tokens_sent:
        out["llamacpp_cache_hit_ratio"] = max(0.0, 1.0 - processed / prompt_tokens_sent)
    for h in TTFT_HISTOGRAMS:
        s, c = _sum(d, h + "_sum"), _sum(d, h + "_count")
        if s is not None and c:
            out["server_ttft_mean_s"] = s / c
            out["server_ttft_source"] = h
            break
    # behind a frontend, its workers' own (Dynamo's vLLM or mocker workers): what routing adds
    s, c = _sum(d, WORKER_TTFT + "_sum"), _sum(d, WORKER_TTFT + "_count")
    if out.get("server_ttft_source") != WORKER_TTFT and s is not None and c:
        families.add("dynamo-workers")
        out["workers_ttft_mean_s"] = s / c
    out["families"] = sorted(families)
    return out


def hit_ratio(m: dict[str, Any]) -> float | None:
    """The server's own answer to "did these requests hit the cache?", whichever it reports."""
    ratios = [
        m.get(k)
        for k in (
            "prefix_cache_hit_ratio",
            "external_prefix_cache_hit_ratio",
            "lmcache_hit_ratio",
            "llamacpp_cache_hit_ratio",
            "dynamo_frontend_hit_ratio",
        )
    ]
    found = [r for r in ratios if r is not None]
    if not found:
        return None
    g1 = m.get("prefix_cache_hit_ratio") or 0.0
    ext = m.get("external_prefix_cache_hit_ratio") or 0.0
    # G1 hits and external-tier hits are disjoint shares of the same queried tokens.
    if m.get("prefix_cache_hit_ratio") is not None or m.get("external_prefix_cache_hit_ratio") is not None:
        return min(1.0, g1 + ext)
    return max(found)


def as_json(d: Snapshot) -> dict[str, float]:
    """Raw deltas with readable keys: name{label="v",...}."""
    out = {}
    for (name, labels), v in sorted(d.items()):
        if v == 0:
            continue
        lbl = ",".join(f'{k}="{val}"' for k, val in labels)
        out[f"{name}{{{lbl}}}" if lbl else name] = v
    return out
