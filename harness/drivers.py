"""The two workload drivers and the per-request bookkeeping they share.

- sweep: per length and repetition, one cold request (a fresh prompt) then `warm_repeats`
  requests of the same prompt, one request in flight at a time so queueing never pollutes TTFT.
- closed_loop: `concurrency` workers take the next request from one pre-drawn schedule of
  `requests` prompts drawn (seeded) from a pool of `pool` prompts, until all are done.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import orjson

from harness import endpoint, prompts, stats
from harness.client import Exchange, StreamingClient
from harness.progress import RunProgress
from harness.prompts import Prompt, PromptBuilder
from harness.results import RecordSink
from harness.scenario import Arm, Distribution, Scenario
from harness.scrape import Scraper

# A run stops early after this many consecutive requests that could not connect.
_DEAD_ENDPOINT_STREAK = 10
# A warm request is flagged when the server reports less than this share of it as cached
# (hits are block-aligned, so a fully warm prompt still reports slightly less than its length).
WARM_CACHED_SHARE = 0.9


@dataclass
class ArmRun:
    scenario: Scenario
    arm: Arm
    client: StreamingClient
    base_url: str
    model: str
    builder: PromptBuilder
    writer: RecordSink
    progress: RunProgress
    stop: asyncio.Event
    t0_ns: int
    time_scale: float
    run_id: str
    rng: random.Random
    warnings: list[str] = field(default_factory=list)
    aborted: str | None = None
    send_salt: bool = True
    said_no_cached: bool = False
    worker_health: dict[str, Any] | None = None  # --workers: the worker processes' own
    in_flight: int = 0
    scraper: Scraper | None = None  # sweeps: server counters around every request
    server: str = "openai"  # "vllm", "llama.cpp", ...: what the endpoint turned out to be
    off_target: set[str] = field(default_factory=set)
    _seq: int = 0
    _dead_streak: int = 0

    @property
    def bust(self) -> bool:
        return self.arm.cache == "bust"

    def reuse_lead(self, prompt: Prompt) -> str:
        """The prompt's lead, made this arm's own: arms are separate experiments, so one arm never
        finds the KV another left behind (even where a cache reset leaves offloaded tiers full)."""
        digest = hashlib.blake2b(f"{self.arm.name}/{prompt.lead}".encode(), digest_size=8).digest()
        return prompts.lead(int.from_bytes(digest, "big"))

    def new_lead(self) -> str:
        return prompts.lead(self.rng.randrange(10**prompts.LEAD_DIGITS))

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        self.progress.console.print(f"[yellow]warning:[/] {text}", markup=True, highlight=False)

    def _body(self, text: str, salt: str | None) -> bytes:
        ep = self.scenario.endpoint
        body: dict[str, Any] = {"model": self.model, "max_tokens": ep.max_tokens, "temperature": ep.temperature}
        body.update(ep.extra_body)
        body["stream"] = True
        body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
        if ep.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if salt is not None and self.send_salt:
            body["cache_salt"] = salt
        if self.bust and self.server == "llama.cpp":
            body["cache_prompt"] = False  # llama.cpp: do not reuse (or keep) this prompt's KV
        return orjson.dumps(body)

    @property
    def url(self) -> str:
        path = "/chat/completions" if self.scenario.endpoint.api == "chat" else "/completions"
        return endpoint.join(self.base_url, path)

    async def send(self, prompt: Prompt, phase: str, lead_text: str, **extra: Any) -> dict[str, Any]:
        self._seq += 1
        seq = self._seq
        salt = lead_text.strip(" []") if self.bust and self.scenario.endpoint.send_cache_salt != "never" else None
        body = self._body(prompt.text(lead_text), salt)
        request_id = f"{self.run_id}-{self.arm.name}-{seq}"
        before = await self.scraper.snapshot() if self.scraper else None
        self.in_flight += 1
        try:
            ex = await self.client.stream(self.url, body, request_id)
        finally:
            self.in_flight -= 1
        if (
            salt is not None
            and self.scenario.endpoint.send_cache_salt == "auto"
            and ex.http_status in (400, 422)
            and "cache_salt" in (ex.error or "")
        ):
            self.send_salt = False
            self.warn("the endpoint refuses `cache_salt`; bust requests rely on their unique leading text alone")
            ex = await self.client.stream(self.url, self._body(prompt.text(lead_text), None), request_id)
        record = self._record(seq, ex, prompt, phase, **extra)
        if self.scraper is not None:
            self.scraper.record(phase, before, await self.scraper.snapshot(), [record])
        self._check_length(record)
        self.writer.add(record)
        self.progress.advance(record)
        self._dead_streak = self._dead_streak + 1 if ex.error_kind == "connect" else 0
        if self._dead_streak >= _DEAD_ENDPOINT_STREAK and not self.aborted:
            self.aborted = f"{self._dead_streak} requests in a row could not connect: {ex.error}"
            self.stop.set()
        return record

    def _check_length(self, r: dict[str, Any]) -> None:
        """The server's own count of what was really sent (a bust lead can tokenize differently)."""
        target, got = r["target_tokens"], r["prompt_tokens"]
        off = target and got is not None and abs(got - target) > self.scenario.prompts.tolerance * target
        if off and r["prompt_id"] not in self.off_target:
            self.off_target.add(r["prompt_id"])
            self.warn(f"request {r['id']} ({r['prompt_id']}): the server counted {got} prompt tokens, target {target}")

    def _record(self, seq: int, ex: Exchange, prompt: Prompt, phase: str, **extra: Any) -> dict[str, Any]:
        scale = self.time_scale
        st = ex.state

        def since_start(t_ns: int | None) -> float | None:
            return None if t_ns is None else round((t_ns - ex.start_ns) / 1e9 * scale, 7)

        chunks = st.token_chunk_ns
        return {
            "id": seq,
            "arm": self.arm.name,
            "phase": phase,
            "prompt_id": prompt.id,
            "target_tokens": prompt.target_tokens,
            "prompt_tokens": st.prompt_tokens,
            "cached_tokens": st.cached_tokens,
            "completion_tokens": st.completion_tokens,
            "start_s": round((ex.start_ns - self.t0_ns) / 1e9 * scale, 7),
            "ttft_s": since_start(st.first_token_ns),
            "first_byte_s": since_start(st.first_byte_ns),
            "first_content_s": since_start(st.first_content_ns),
            "headers_s": since_start(ex.headers_ns),
            "e2e_s": since_start(ex.end_ns),
            "itl_s": np.round(np.diff(np.asarray(chunks, dtype=np.float64)) * (scale / 1e9), 7).tolist()
            if len(chunks) > 1
            else [],
            "ok": ex.ok,
            "error": ex.error,
            "error_kind": ex.error_kind,
            "http_status": ex.http_status,
            "retried": ex.retried,
            **extra,
        }

    async def build(self, prompt_id: str, target: int, shared: str = "") -> Prompt:
        prompt = await self.builder.build(prompt_id, target, shared)
        if not self.builder.within_tolerance(prompt):
            self.warn(
                f"prompt {prompt_id}: {prompt.tokens} tokens, target {target} "
                f"(outside ±{self.scenario.prompts.tolerance:.1%})"
            )
        return prompt


async def sweep(run: ArmRun) -> None:
    w = run.scenario.workload
    run.progress.start(run.arm.name, len(w.lengths) * w.repetitions * (1 + w.warm_repeats))
    for length in w.lengths:
        for rep in range(w.repetitions):
            if run.stop.is_set():
                return
            run.progress.note(f"building a {length}-token prompt")
            prompt = await run.build(f"L{length}-r{rep}", length)
            lead = run.new_lead() if run.bust else run.reuse_lead(prompt)
            cold = await run.send(prompt, "cold", lead, repeat=0)
            _check_cold(run, cold)
            for i in range(w.warm_repeats):
                if run.stop.is_set():
                    return
                if run.bust:  # every request unique: all of them are cold
                    cold = await run.send(prompt, "cold", run.new_lead(), repeat=i + 1)
                    _check_cold(run, cold)
                else:
                    _check_warm(run, await run.send(prompt, "warm", lead, repeat=i + 1))


def _check_cold(run: ArmRun, r: dict[str, Any]) -> None:
    allowed = run.scenario.workload.shared_prefix_tokens + run.builder.template_tokens
    if r["ok"] and (r["cached_tokens"] or 0) > allowed:
        run.warn(
            f"request {r['id']} ({r['prompt_id']}) was meant to be cold but the server reports "
            f"{r['cached_tokens']} cached tokens: its cold TTFT is not cold"
        )


def _check_warm(run: ArmRun, r: dict[str, Any]) -> None:
    if not r["ok"] or r["prompt_tokens"] is None:
        return
    if r["cached_tokens"] is None:
        if not run.said_no_cached:
            run.said_no_cached = True
            run.warn(
                "the server does not report usage.prompt_tokens_details.cached_tokens, so warm requests "
                "cannot be verified (vLLM: start it with --enable-prompt-tokens-details)"
            )
        return
    if r["cached_tokens"] < WARM_CACHED_SHARE * r["prompt_tokens"]:
        run.warn(
            f"request {r['id']} ({r['prompt_id']}) was meant to be warm but only {r['cached_tokens']} of "
            f"{r['prompt_tokens']} prompt tokens came from cache: its warm TTFT is not warm"
        )


def _draw_length(d: Distribution, rng: random.Random) -> int:
    if d.kind == "fixed":
        return d.value
    if d.kind == "uniform":
        return rng.randint(d.min, d.max)
    return max(d.min, min(d.max, round(rng.gauss(d.mean, d.stddev))))


async def build_pool(run: ArmRun) -> list[Prompt]:
    w = run.scenario.workload
    if run.scenario.prompts.source == "file":
        assert run.scenario.prompts.path is not None
        found = prompts.load_file(run.scenario.prompts.path, run.builder)
        if len(found) < w.pool:
            run.warn(f"{run.scenario.prompts.path} holds {len(found)} prompts, fewer than the pool of {w.pool}")
        return [found[i % len(found)] for i in range(w.pool)]
    assert w.prompt_tokens is not None
    rng = random.Random(f"{run.scenario.prompts.seed}/pool-lengths")
    lengths = [_draw_length(w.prompt_tokens, rng) for _ in range(w.pool)]
    run.progress.note(f"building {w.pool} prompts")
    shared = await run.builder.shared_prefix(w.shared_prefix_tokens)
    return [await run.build(f"p{i:05d}", n, shared) for i, n in enumerate(lengths)]


def schedule(scenario: Scenario) -> list[int]:
    w = scenario.workload
    rng = random.Random(f"{scenario.prompts.seed}/schedule")
    return [rng.randrange(w.pool) for _ in range(w.requests)]


class Order(Protocol):
    """Requests to send: (schedule index, pool index) pairs; a list, or workers.SharedOrder."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[tuple[int, int]]: ...


async def closed_loop(
    run: ArmRun,
    pool: list[Prompt],
    order: Order | None = None,
    concurrency: int | None = None,
    first_worker: int = 0,
) -> None:
    """`order`: (schedule index, pool index) pairs to send (default: the whole schedule), taken
    in turn by `concurrency` connections (default: the scenario's). workers.py hands each
    process an order shared with the others."""
    w = run.scenario.workload
    order = order if order is not None else list(enumerate(schedule(run.scenario)))
    concurrency = concurrency or w.concurrency
    run.progress.start(run.arm.name, len(order))
    queue = iter(order)

    async def worker(n: int) -> None:
        for i, p in queue:
            if run.stop.is_set():
                return
            lead = run.new_lead() if run.bust else run.reuse_lead(pool[p])
            r = await run.send(pool[p], "run", lead, worker=n, schedule_index=i)
            if run.bust and r["ok"] and (r["cached_tokens"] or 0) > 0:
                run.warn(f"request {r['id']} of bust arm {run.arm.name} hit the cache ({r['cached_tokens']} tokens)")

    await asyncio.gather(*(worker(first_worker + n) for n in range(concurrency)))


def print_summary(run: ArmRun, records: list[dict[str, Any]]) -> dict[str, Any]:
    from rich.table import Table

    kind = run.scenario.workload.kind
    s = stats.summary(records, kind)
    con = run.progress.console
    unit = " (model time)" if run.time_scale != 1 else ""
    if kind == "sweep":
        t = Table(title=f"{run.scenario.name} / {run.arm.name}: TTFT by prompt length{unit}")
        for col in ("tokens", "cold p50 s", "warm p50 s", "speedup", "n cold/warm"):
            t.add_column(col, justify="right")
        for row in s["by_length"]:
            t.add_row(
                f"{row['length']:,}",
                _fmt(row["cold_ttft_p50_s"]),
                _fmt(row["warm_ttft_p50_s"]),
                f"{row['speedup']:.1f}x" if row["speedup"] else "-",
                f"{row['cold_n']}/{row['warm_n']}",
            )
        con.print(t)
    else:
        ttft = s["ttft_s"]
        con.print(
            f"[bold]{run.scenario.name} / {run.arm.name}[/]: {s['completed']}/{s['requests']} completed, "
            f"{_fmt(s['req_per_s'], 3)} req/s, TTFT p50 {_fmt(ttft['p50'])} s, p99 {_fmt(ttft['p99'])} s, "
            f"duration {_fmt(s['duration_s'], 2)} s{unit}"
        )
    return s


def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
