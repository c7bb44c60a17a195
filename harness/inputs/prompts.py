"""Prompts of exact length, as the server counts them.

Layout of every synthetic prompt:

    [LEAD] SHARED-PREFIX [kvbench prompt ID] BODY

- LEAD is 12 decimal digits in brackets, right after whatever the chat template puts first. In
  a "reuse" arm it is derived from a random per-run salt and the prompt's id (or, with a shared
  prefix, from the salt alone, so that the pool shares it), so fixed-seed prompts never find a
  previous run's KV and two prompts never share a KV block. A "bust" arm gives each request a
  lead of its own, so nothing can come from a cache. Decimal digits of a fixed width tokenize to
  the same number of tokens in common tokenizers, so swapping them keeps the length; every
  request's real length is recorded anyway.
- SHARED-PREFIX (only when `shared_prefix_tokens` > 0) is the same text for all prompts of a pool.
- The identifier names the prompt in the text, for whoever reads a server log.
- BODY is deterministic text from the seed, trimmed or extended word by word until the server's
  count (chat template included) hits the target.

The count comes from a `Counter` (an async function text -> tokens): the server's /tokenize when
it has one, else an estimate calibrated on `usage.prompt_tokens` (see endpoint.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import EndpointError

Counter = Callable[[str], Awaitable[int]]

LEAD_DIGITS = 12
_MAX_ROUNDS = 12
VOCAB = (
    "storage",
    "cache",
    "token",
    "layer",
    "block",
    "memory",
    "tier",
    "network",
    "bandwidth",
    "latency",
    "prefill",
    "decode",
    "request",
    "context",
    "window",
    "model",
    "server",
    "client",
    "answer",
    "question",
    "document",
    "section",
    "report",
    "figure",
    "table",
    "value",
    "system",
    "cluster",
    "node",
    "disk",
    "flash",
    "volume",
    "file",
    "path",
    "record",
    "batch",
    "queue",
    "thread",
    "process",
    "signal",
    "stream",
    "packet",
    "buffer",
    "vector",
    "matrix",
    "kernel",
    "tensor",
    "weight",
    "head",
    "query",
    "key",
    "attention",
    "river",
    "mountain",
    "forest",
    "garden",
    "window",
    "kitchen",
    "library",
    "market",
    "harbor",
    "bridge",
    "village",
    "island",
    "morning",
    "evening",
    "winter",
    "summer",
    "season",
    "weather",
    "cloud",
    "light",
    "shadow",
    "colour",
    "sound",
    "voice",
    "story",
    "history",
    "science",
    "nature",
    "energy",
    "motion",
    "balance",
    "pattern",
    "measure",
    "number",
    "letter",
    "method",
    "result",
    "careful",
    "quiet",
    "rapid",
    "gentle",
    "simple",
    "narrow",
    "broad",
    "early",
    "late",
    "bright",
    "heavy",
    "steady",
    "certain",
    "build",
    "carry",
    "gather",
    "follow",
    "measure",
    "compare",
    "record",
    "explain",
    "observe",
    "repeat",
    "divide",
    "connect",
)


def lead(n: int) -> str:
    return f"[{n % 10**LEAD_DIGITS:0{LEAD_DIGITS}d}] "


def body_words(seed: int, key: str, count: int) -> list[str]:
    """Deterministic words for one prompt; a sentence ends every 12 words."""
    rng = random.Random(f"{seed}/{key}")
    words = rng.choices(VOCAB, k=count)
    for i in range(11, count, 12):
        words[i] += "."
    return words


@dataclass(frozen=True)
class Prompt:
    id: str
    lead: str  # the lead of a reuse request
    rest: str  # everything after the lead
    target_tokens: int | None
    tokens: int | None  # as counted while building (None: not counted)
    max_tokens: int | None = None  # output tokens asked for, when the prompt sets it (traces)
    # a trace's prompt: `rest` joined at send time from block texts that many prompts share
    # (10,000 prompts of 8K tokens would otherwise hold 400 MB of text)
    parts: tuple[str, ...] = ()

    def text(self, lead_text: str | None = None) -> str:
        rest = " ".join(self.parts) if self.parts else self.rest
        return (self.lead if lead_text is None else lead_text) + rest


class PromptCache:
    """The sizes (body words, filler words) found for earlier prompts, one JSON file per tokenizer
    fingerprint: a later run checks a cached size with a single count instead of searching."""

    def __init__(self, folder: Path, fingerprint: str) -> None:
        self.path = folder / f"{fingerprint}.json"
        try:
            self.sizes: dict[str, list[int]] = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.sizes = {}

    def get(self, key: str) -> tuple[int, int] | None:
        v = self.sizes.get(key)
        return (int(v[0]), int(v[1])) if isinstance(v, list) and len(v) == 2 else None

    def put(self, key: str, words: int, filler: int) -> None:
        if self.sizes.get(key) == [words, filler]:
            return
        self.sizes[key] = [words, filler]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")  # (runs side by side share the cache)
            tmp.write_text(json.dumps(self.sizes), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written only costs time


def cache_folder() -> Path | None:
    """prompts/.cache when run from a kvbench checkout, else the user's cache folder;
    KVBENCH_PROMPT_CACHE=off disables it, any other value names the folder."""
    env = os.environ.get("KVBENCH_PROMPT_CACHE")
    if env:
        return None if env.lower() in ("off", "0", "no") else Path(env)
    if Path("prompts").is_dir():
        return Path("prompts") / ".cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench" / "prompts"


async def fingerprint(count: Counter, *identity: str) -> str:
    """Identifies a tokenizer (and chat template) by what it makes of a fixed probe text."""
    probe = " ".join(body_words(0, "tokenizer-fingerprint", 400)) + " 0123456789 ÄÖÜ – “quotes” {json: [1, 2]}"
    parts = [*identity, str(await count(probe)), str(await count(""))]
    return hashlib.blake2b("|".join(parts).encode(), digest_size=10).hexdigest()


class PromptBuilder:
    """Builds prompts of an exact token count, learning the tokens-per-word ratio as it goes so
    that most prompts need only one or two counts (one, with a cache of earlier sizes)."""

    def __init__(
        self, count: Counter, seed: int, tolerance: float, run_salt: int, cache: PromptCache | None = None
    ) -> None:
        self.count = count
        self.cache = cache
        self.seed = seed
        self.tolerance = tolerance
        self.run_salt = run_salt
        self._ratio = 1.0  # tokens per body word, refined by every count
        # Tokens the chat template adds around any prompt: a cold request may legitimately find
        # the template's fixed opening in cache (it is the same for every prompt).
        self.template_tokens = 0

    def reuse_lead(self, key: str) -> str:
        digest = hashlib.blake2b(f"{self.run_salt}/{key}".encode(), digest_size=8).digest()
        return lead(int.from_bytes(digest, "big"))

    async def shared_prefix(self, tokens: int) -> str:
        """About `tokens` tokens of shared text (counted with the lead and the chat template)."""
        if tokens <= 0:
            return ""
        prompt = await self.build("shared", tokens, key="shared-prefix", header="")
        return prompt.rest

    async def build(
        self, prompt_id: str, target: int, shared: str = "", key: str | None = None, header: str | None = None
    ) -> Prompt:
        if not self.template_tokens:
            self.template_tokens = await self.count("")
        head = shared + (f"[kvbench prompt {prompt_id}] " if header is None else header)
        words = body_words(self.seed, key or prompt_id, max(16, int(target / self._ratio * 1.1)))
        reuse = self.reuse_lead("shared-prefix" if shared or header == "" else prompt_id)

        def text(k: int, filler: int = 0) -> str:
            return reuse + head + " ".join(words[:k] + ["and"] * filler)

        cache_key = "|".join((str(self.seed), key or prompt_id, str(target), head))
        if self.cache is not None and (known := self.cache.get(cache_key)) is not None:
            k, filler = known
            while k > len(words):
                words += body_words(self.seed, f"{key or prompt_id}/{len(words)}", len(words))
            if await self.count(text(k, filler)) == target:
                return Prompt(prompt_id, reuse, text(k, filler)[len(reuse) :], target, target)

        base = await self.count(text(0))
        if base > target:
            raise EndpointError(
                f"prompt {prompt_id}: the fixed parts alone are {base} tokens, more than the target {target}"
            )
        k = max(0, round((target - base) / self._ratio))
        best: tuple[int, int, int, int] | None = None  # (|error|, k, filler, count)
        below: tuple[int, int] | None = None  # the longest body found short of the target: (k, count)
        for _ in range(_MAX_ROUNDS):
            while k > len(words):
                words += body_words(self.seed, f"{key or prompt_id}/{len(words)}", len(words))
            n = await self.count(text(k))
            if k > 0 and n > base:
                self._ratio = (n - base) / k
            if best is None or abs(n - target) < best[0]:
                best = (abs(n - target), k, 0, n)
            if n < target and (below is None or n > below[1]):
                below = (k, n)
            if n == target:
                break
            step = round((target - n) / self._ratio)
            k = max(0, k + (step if step else (1 if n < target else -1)))
        assert best is not None
        if best[0] and below is not None:
            # Words with punctuation cost two tokens, so a target can fall between two word
            # counts: close the gap with short filler words, usually one token each.
            kb, nb = below
            n = await self.count(text(kb, target - nb))
            if abs(n - target) < best[0]:
                best = (abs(n - target), kb, target - nb, n)
        _, k, filler, counted = best
        if self.cache is not None and counted == target:
            self.cache.put(cache_key, k, filler)
        return Prompt(prompt_id, reuse, text(k, filler)[len(reuse) :], target, counted)

    def within_tolerance(self, prompt: Prompt) -> bool:
        return (
            prompt.tokens is None
            or prompt.target_tokens is None
            or (abs(prompt.tokens - prompt.target_tokens) <= self.tolerance * prompt.target_tokens)
        )


def load_file(path: str, builder: PromptBuilder) -> list[Prompt]:
    """Prompts from a JSONL file, one `{"id": ..., "prompt": ...}` per line, used as they are
    (their length is whatever the server counts; it is recorded per request)."""
    from harness.core.errors import InputError

    out: list[Prompt] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"prompts.path: cannot read {path}: {e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise InputError(f"{path}:{n}: not JSON: {e}") from None
        except RecursionError:
            raise InputError(f"{path}:{n}: not JSON: nested too deeply") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise InputError(f'{path}:{n}: expected an object with a string "prompt"')
        pid = str(obj.get("id", f"line{n}"))
        out.append(Prompt(pid, builder.reuse_lead(pid), obj["prompt"], None, None))
    if not out:
        raise InputError(f"{path}: no prompts")
    return out


class BlockPrompts:
    """Prompts of a trace, built from blocks: each hash id is a block of text of exactly
    `block_tokens` tokens, the same text wherever the id appears, so requests that share leading
    ids share that text, and with it the chat template's opening and the lead before it: at
    least the shared blocks' tokens (as many as the opening more, in the server's count). The
    tail (a partial last block, or text of the request's own) is shortened by the template and
    lead, so the input length is the trace's.

    Sizes come from each word's cost, counted once (about 170 counts per run, not one per
    prompt): with tokenizers that split text at spaces before merging (GPT-2-style byte BPE,
    SentencePiece, the emulator's), a text of space-separated words costs the sum of its words,
    so a trace of 10,000 requests builds in seconds. The server's count of every request is
    recorded beside its target."""

    def __init__(self, builder: PromptBuilder, block_tokens: int, aligned: bool = False) -> None:
        self.builder, self.block_tokens = builder, block_tokens
        # No chat template (the completions API): the opening is the lead alone, and the first
        # block is shortened by it, so the trace's blocks start where the server's do.
        self.aligned = aligned
        self.fixed = 0  # template + lead tokens
        self.cost: dict[str, int] = {}  # tokens of " word"
        self._filler: list[str] = []  # the cheapest words
        self._dearest = 1
        self._blocks: dict[int, tuple[list[str], str]] = {}  # hash id -> (words, text)
        self._pieces: dict[str, str] = {}

    async def calibrate(self, lead_text: str) -> None:
        # The opening's own cost, from the difference of two lengths: alone, the lead's trailing
        # space would count as a token that a following word takes into its own.
        ref = [VOCAB[0]]
        n8 = await self.builder.count(lead_text + " ".join(ref * 8))
        n16 = await self.builder.count(lead_text + " ".join(ref * 16))
        self.fixed = n8 - (n16 - n8)
        self.builder.template_tokens = self.builder.template_tokens or await self.builder.count("")
        for word in dict.fromkeys(VOCAB):
            n = await self.builder.count(lead_text + " ".join([word] * 8))
            self.cost[word] = max(1, round((n - self.fixed) / 8))
        cheapest, self._dearest = min(self.cost.values()), max(self.cost.values())
        self._filler = [w for w, c in self.cost.items() if c == cheapest]

    def _fill(self, key: str, tokens: int, start: list[str] | None = None) -> list[str]:
        """Words costing `tokens` in all (or as near as the cheapest word allows): `start`'s own
        words while they fit, then seeded words, then the cheapest ones."""
        rng = random.Random(f"{self.builder.seed}/block/{key}")
        words: list[str] = []
        left = tokens
        for w in start or ():
            if self.cost[w] > left:
                break
            words.append(w)
            left -= self.cost[w]
        cheapest, dearest = self.cost[self._filler[0]], self._dearest
        while left >= 2 * cheapest + dearest:
            batch = rng.choices(VOCAB, k=(left - 2 * cheapest) // dearest)  # surely fits
            words += batch
            left -= sum(map(self.cost.__getitem__, batch))
        while left >= cheapest:
            words.append(rng.choice(self._filler))
            left -= cheapest
        return words

    def piece(self, key: str, tokens: int) -> str:
        """Text of exactly `tokens` tokens (as near as the cheapest word allows), the same for a
        key: a system prompt, a user's document, a message, an answer."""
        if (got := self._pieces.get(key)) is None:
            got = self._pieces[key] = " ".join(self._fill(key, tokens))
        return got

    def _first(self, h: int) -> str:
        """A first block shortened by the opening (aligned prompts)."""
        return self.piece(f"first/{h}", self.block_tokens - self.fixed)

    def block(self, h: int) -> tuple[list[str], str]:
        if (got := self._blocks.get(h)) is None:
            words = self._fill(str(h), self.block_tokens)
            got = self._blocks[h] = (words, " ".join(words))
        return got

    @property
    def aligned_head(self) -> bool:
        """Is the opening (template, lead) inside the first block, not before the blocks?"""
        return self.aligned and self.fixed < self.block_tokens

    def prompt(self, prompt_id: str, lead_text: str, hash_ids: tuple[int, ...], tokens: int, output: int) -> Prompt:
        b = self.block_tokens
        aligned = self.aligned_head  # the opening inside the first block; else before it
        full = min(len(hash_ids), (tokens if aligned else max(0, tokens - self.fixed)) // b)
        texts = [self._first(h) if aligned and i == 0 else self.block(h)[1] for i, h in enumerate(hash_ids[: full + 1])]
        parts = texts[:full]
        left = tokens - full * b - (0 if aligned and full else self.fixed)
        if left > 0:  # a partial block: the start of its own text, or the request's own text
            tail = texts[full].split(" ") if full < len(hash_ids) else []
            parts.append(" ".join(self._fill(f"tail/{prompt_id}", left, tail)))
        return Prompt(prompt_id, lead_text, "", tokens, None, output or None, tuple(parts))
