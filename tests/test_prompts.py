"""Exact-length prompts, checked against the emulator's tokenizer (chat template included) and
against a less regular tokenizer."""

from __future__ import annotations

import asyncio
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.emulator import tokenizer
from harness.inputs import prompts
from harness.inputs.prompts import PromptBuilder


def chat_counter(calls: list[int]) -> prompts.Counter:
    async def count(text: str) -> int:
        calls.append(1)
        return tokenizer.count(tokenizer.render_chat([{"role": "user", "content": text}]))

    return count


async def completions_count(text: str) -> int:
    return tokenizer.count(text)


async def bpe_like_count(text: str) -> int:
    """Roughly 1.3 tokens per word, depending on word length: not additive in whole words."""
    return 7 + sum(1 + len(w) // 5 for w in re.findall(r"\S+", text))


@settings(max_examples=60, deadline=None)
@given(st.integers(200, 140_000), st.sampled_from(["chat", "completions", "bpe"]))
def test_exact_length(target: int, kind: str) -> None:
    calls: list[int] = []
    count = {"chat": chat_counter(calls), "completions": completions_count, "bpe": bpe_like_count}[kind]
    builder = PromptBuilder(count, seed=1, tolerance=0.005, run_salt=99)
    p = asyncio.run(builder.build("L-x", target))
    real = asyncio.run(count(p.text()))
    assert real == p.tokens
    assert abs(real - target) <= 0.005 * target
    if kind != "bpe":
        assert real == target  # a word-level tokenizer can always be hit exactly
    assert p.text().startswith(p.lead) and p.lead.startswith("[")


def test_few_counts_once_the_ratio_is_learned() -> None:
    calls: list[int] = []
    builder = PromptBuilder(chat_counter(calls), seed=1, tolerance=0.005, run_salt=5)

    async def build_all() -> None:
        for n in (10_000, 20_000, 40_000, 130_000):
            await builder.build(f"L{n}", n)

    asyncio.run(build_all())
    assert len(calls) <= 1 + 4 * 6  # the template probe, then a few counts per prompt


def test_deterministic_and_distinct() -> None:
    def build(salt: int, pid: str) -> prompts.Prompt:
        return asyncio.run(PromptBuilder(completions_count, 3, 0.005, salt).build(pid, 500))

    a, b = build(1, "p1"), build(1, "p1")
    assert a == b
    c = build(1, "p2")
    assert a.lead != c.lead  # distinct prompts differ from their first token
    assert build(2, "p1").lead != a.lead  # another run never reuses this run's KV
    assert a.rest == build(2, "p1").rest  # the text itself depends on the seed only


def test_bust_lead_keeps_the_length() -> None:
    p = asyncio.run(PromptBuilder(completions_count, 3, 0.005, 1).build("p", 3000))
    for n in (0, 7, 10**12 - 1, 123456789):
        assert tokenizer.count(p.text(prompts.lead(n))) == 3000


def test_shared_prefix_is_shared() -> None:
    builder = PromptBuilder(completions_count, 3, 0.005, 1)

    async def go() -> tuple[prompts.Prompt, prompts.Prompt]:
        shared = await builder.shared_prefix(1000)
        return await builder.build("p0", 3000, shared), await builder.build("p1", 3000, shared)

    a, b = asyncio.run(go())
    common = len(tokenizer.tokenize(a.text())[:1000])
    assert tokenizer.tokenize(a.text())[:common] == tokenizer.tokenize(b.text())[:common]
    assert a.tokens == b.tokens == 3000


def test_cache_of_sizes_needs_one_count_next_time(tmp_path: object) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    for run, expected_max in ((1, None), (2, 2)):  # the template probe, then one count
        calls: list[int] = []
        count = chat_counter(calls)
        cache = prompts.PromptCache(folder, asyncio.run(prompts.fingerprint(count, "emulator")))
        calls.clear()
        builder = PromptBuilder(count, seed=4, tolerance=0.005, run_salt=run, cache=cache)
        p = asyncio.run(builder.build("L50000", 50_000))
        assert p.tokens == 50_000 == asyncio.run(count(p.text()))
        if expected_max is not None:
            assert len(calls) <= expected_max + 1  # + the check just above
    other = prompts.PromptCache(folder, "another-tokenizer")
    assert other.sizes == {}  # sizes never cross tokenizers
