"""Prompt building for the whole Redbooks TTFT sweep (7 lengths x 3 prompts, 10K-130K tokens)
against the emulator's /tokenize: time and number of counts, without and then with the cache of
earlier sizes (a fresh temporary one).

    python bench/prompt_build.py
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
from common import ROOT

from harness.config import scenario
from harness.emulator.serve import EmbeddedEmulator
from harness.inputs import prompts
from harness.server import endpoint


async def build_all(base: str, cache_dir: Path | None) -> tuple[float, int]:
    sc = scenario.load(ROOT / "scenarios" / "redbooks-ttft-sweep.toml")
    async with aiohttp.ClientSession() as s:
        found = await endpoint.server_counter(s, base, "openai/gpt-oss-120b", "chat", {})
        assert found is not None
        raw, flavor = found
        calls = 0

        async def count(text: str) -> int:
            nonlocal calls
            calls += 1
            return await raw(text)

        cache = prompts.PromptCache(cache_dir, await prompts.fingerprint(raw, flavor)) if cache_dir else None
        builder = prompts.PromptBuilder(count, sc.prompts.seed, 0.005, 1, cache)
        t = time.perf_counter()
        for n in sc.workload.lengths:
            for rep in range(sc.workload.repetitions):
                await builder.build(f"L{n}-r{rep}", n)
        return time.perf_counter() - t, calls


def main() -> None:
    with EmbeddedEmulator("redbooks-g4", 1.0) as emu, tempfile.TemporaryDirectory() as tmp:
        for label, cache in (("no cache", None), ("cache, first run", Path(tmp)), ("cache, next run", Path(tmp))):
            dt, calls = asyncio.run(build_all(emu.base_url, cache))
            print(f"{label:18s} {dt:6.2f} s  {calls:3d} counts for 21 prompts")


if __name__ == "__main__":
    main()
