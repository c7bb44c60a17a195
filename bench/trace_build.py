"""Trace replay's prompt building: how long kvbench takes to turn a trace of N requests into
prompts (reading the trace, counting the words' costs once with the server, building every
prompt from its blocks), against the embedded emulator's /tokenize. A synthetic Mooncake-style
trace of N requests over 200 shared documents, 1-30 blocks of 512 tokens each.

    python bench/trace_build.py [requests]      # default 10000
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from common import EmbeddedEmulator

from harness.inputs import traces
from harness.inputs.prompts import BlockPrompts, PromptBuilder
from harness.server import endpoint


def make(path: Path, n: int) -> None:
    rng = random.Random(0)
    docs = [list(range(k * 40, k * 40 + rng.randint(1, 30))) for k in range(200)]
    nxt = 10**6
    with path.open("w") as f:
        for i in range(n):
            doc = rng.choice(docs)
            ids = [*doc[: rng.randint(1, len(doc))], nxt, nxt + 1]
            nxt += 2
            f.write(
                json.dumps(
                    {"timestamp": i * 50, "input_length": len(ids) * 512 - 100, "output_length": 50, "hash_ids": ids}
                )
                + "\n"
            )


async def build(base_url: str, path: Path) -> tuple[float, float, int, int]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        found = await endpoint.server_counter(session, base_url, "openai/gpt-oss-120b", "chat", {})
        assert found is not None
        t0 = time.perf_counter()
        trace = traces.read(path)
        t_read = time.perf_counter() - t0
        blocks = BlockPrompts(PromptBuilder(found[0], 42, 0.005, 1), trace.block_tokens)
        lead = blocks.builder.reuse_lead("trace")
        await blocks.calibrate(lead)
        prompts = [
            blocks.prompt(f"t{r.line}", lead, r.hash_ids, r.input_length, r.output_length) for r in trace.requests
        ]
        total = time.perf_counter() - t0
        return t_read, total, len(prompts), len({part for p in prompts for part in p.parts})


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    with tempfile.TemporaryDirectory() as tmp, EmbeddedEmulator("redbooks-g4", 1.0) as emu:
        path = Path(tmp) / "t.jsonl"
        make(path, n)
        t_read, total, count, texts = asyncio.run(build(emu.base_url, path))
    print(f"{count:,} requests: read in {t_read:.2f} s, all prompts built in {total:.2f} s ({texts:,} distinct texts)")


if __name__ == "__main__":
    main()
