"""The emulator's cost model, cache and endpoints (pure parts directly, HTTP on a real port)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from harness.config.reference import redbooks
from harness.emulator.kvcache import KVCache, Tier, block_hashes
from harness.emulator.profiles import get_profile
from harness.emulator.serve import EmbeddedEmulator


def test_calibration_reproduces_the_published_ttft() -> None:
    p = get_profile("redbooks-g4")
    ref = redbooks()["ttft"]
    assert p.prefill_s(10_000) == pytest.approx(ref["no_cache_s"]["10000"], rel=1e-9)
    assert p.prefill_s(130_000) == pytest.approx(ref["no_cache_s"]["130000"], rel=1e-9)
    g4 = p.tiers[0]
    for n, want in zip((10_000, 130_000), ref["cached_s_range"], strict=True):
        cached = (n - 1) // 16 * 16
        got = p.load_s(g4, cached // 16) + p.compute_s(n, cached)
        assert got == pytest.approx(want, rel=1e-9)
    assert 15e9 < g4.read_bytes_per_s < 40e9  # an effective per-request rate, not the cluster's


def test_recompute_profile_has_no_tiers() -> None:
    assert get_profile("recompute").tiers == ()


def test_prefix_matching_lru_and_salt() -> None:
    cache = KVCache([Tier("G1", 4, float("inf"), 0.0), Tier("G4", 100, 1e9, 0.01)], 2)
    a = block_hashes(list("abcdefgh"), 2)
    assert cache.lookup(a, 8).cached_tokens == 0
    cache.store(a)
    m = cache.lookup(a, 8)
    assert m.cached_tokens == 6  # the last block is recomputed: one token must be computed
    assert m.g1_blocks == 3 and m.load_blocks == {}
    b = block_hashes(list("abcdXYZW"), 2)  # shares two blocks
    assert cache.lookup(b, 8).cached_tokens == 4
    cache.store(block_hashes(list("qrstuvwx"), 2))  # evicts a's blocks from the 4-block G1
    m = cache.lookup(a, 8)
    assert m.cached_tokens == 6 and m.load_blocks.get("G4", 0) > 0
    assert cache.tier("G1").evicted_blocks > 0
    assert block_hashes(list("abcd"), 2, salt="s") != block_hashes(list("abcd"), 2)


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> dict[str, object]:
    async with session.post(url, json=body) as r:
        return await r.json()


def test_http_surface(emulator: EmbeddedEmulator) -> None:
    base = emulator.base_url
    root = base.removesuffix("/v1")

    async def go() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/models") as r:
                assert (await r.json())["data"][0]["id"] == "openai/gpt-oss-120b"
            tok = await _post(s, f"{root}/tokenize", {"prompt": "hello, world"})
            assert tok["count"] == 3
            chat = await _post(s, f"{root}/tokenize", {"messages": [{"role": "user", "content": "hello, world"}]})
            assert chat["count"] > 3  # the chat template adds tokens
            text = "one two three " * 200
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 3}
            first = await _post(s, f"{base}/chat/completions", body)
            second = await _post(s, f"{base}/chat/completions", body)
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 500
            salted = await _post(s, f"{base}/chat/completions", {**body, "cache_salt": "x"})
            assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            async with s.get(f"{root}/metrics") as r:
                metrics = await r.text()
            assert "vllm:prefix_cache_queries_total" in metrics and "kvbm_onboard_blocks_d2d" in metrics
            async with s.post(f"{root}/reset_prefix_cache") as r:
                assert r.status == 200
            again = await _post(s, f"{base}/chat/completions", body)
            assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            async with s.post(f"{base}/chat/completions", json={**body, "model": "nope"}) as r:
                assert r.status == 404
            async with s.post(f"{base}/completions", json={"prompt": "x " * 140_000, "max_tokens": 1}) as r:
                assert r.status == 400 and "maximum context length" in (await r.json())["error"]["message"]
            async with s.post(
                f"{base}/completions",
                json={"prompt": "a b c", "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}},
            ) as r:
                raw = await r.read()
            events = [e for e in raw.decode().split("\n\n") if e]
            assert events[-1] == "data: [DONE]"
            usage = json.loads(events[-2].removeprefix("data: "))["usage"]
            assert usage["completion_tokens"] == 2
            # its own lateness against its model, beyond the loop's timer (stats.emulator_late_share)
            late = usage["kvbench_late_s"]
            assert isinstance(late, float) and late >= 0

    asyncio.run(go())


def test_api_key_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMU_KEY", "sekret")
    with EmbeddedEmulator("recompute", 50.0, api_key_env="EMU_KEY") as emu:

        async def go() -> tuple[int, int]:
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{emu.base_url}/models") as r1:
                    pass
                async with s.get(f"{emu.base_url}/models", headers={"Authorization": "Bearer sekret"}) as r2:
                    pass
            return r1.status, r2.status

        assert asyncio.run(go()) == (401, 200)


def test_context_evicted_from_the_gpu_comes_back_from_the_next_tier_that_holds_it() -> None:
    cache = KVCache([Tier("G1", 2, float("inf"), 0.0), Tier("G2", 4, 50e9, 0.001), Tier("G4", 10**6, 2e10, 0.16)], 16)
    a, b, c = [1, 2], [3, 4], [5, 6]
    for h in (a, b):
        cache.store(h, cache.lookup(h, 3 * 16))
    assert cache.lookup(b, 3 * 16).g1_blocks == 2  # the latest: still on the GPU
    got = cache.lookup(a, 3 * 16)  # pushed out of G1 by b, still in host memory
    assert got.g1_blocks == 0 and got.load_blocks == {"G2": 2}
    cache.store(a, got)
    for h in ([7, 8], [9, 10], c):
        cache.store(h, cache.lookup(h, 3 * 16))
    assert cache.lookup(b, 3 * 16).load_blocks == {"G4": 2}  # gone from G1 and G2: from storage
    assert cache.lookup([11, 12], 3 * 16).cached_tokens == 0  # never seen: recomputed


def test_the_tiered_profile_keeps_the_redbooks_model_and_g4() -> None:
    tiered, g4 = get_profile("tiered"), get_profile("redbooks-g4")
    assert [t.name for t in tiered.tiers] == ["G1", "G2", "G4"] and tiered.tiers[2] == g4.tiers[0]
    assert (tiered.prefill_a, tiered.prefill_b) == (g4.prefill_a, g4.prefill_b)
