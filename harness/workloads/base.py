"""What every workload kind shares: the arm it runs (`ArmSpec`), and the `Sender` that sends one
request, turns the exchange into a `RequestRecord` and announces it, as it ends, to whoever
subscribed (the writer, the progress display, the server-metrics scraper, the checks): one event
per finished request, locust-style."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, Generic, Literal, TypeVar

import orjson
from rich.markup import escape

from harness.config.context import Context
from harness.config.kinds.open_loop import rate_label
from harness.config.kinds.pool import PoolConfig
from harness.config.scenario import Arm, Scenario
from harness.core import aio
from harness.core.clock import ModelClock
from harness.inputs import prompts
from harness.inputs.prompts import Prompt, PromptBuilder
from harness.monitor.progress import RunProgress
from harness.results import KindRecord, RequestRecord
from harness.server import checks, endpoint
from harness.server.scrape import Scraper
from harness.wire.client import Exchange, InFlightCancelled, StreamingClient

# A run stops early after this many consecutive requests that could not connect or timed out.
DEAD_ENDPOINT_STREAK = 10
DEAD_KINDS = {"connect": "could not connect", "timeout": "timed out"}
LENGTH_WARNINGS = 5  # prompts named for being off their target length; beyond, one line says more are


@lru_cache(maxsize=4096)  # a closed loop asks again for each request of a prompt
def _arm_lead(arm: str, use: str, lead: str) -> str:
    digest = hashlib.blake2b(f"{arm}/{use}{lead}".encode(), digest_size=8).digest()
    return prompts.lead(int.from_bytes(digest, "big"))


@dataclass(frozen=True)
class Load:
    """The load one open-loop result folder was measured at: arrivals at `rate` req/s, or one of
    the probes of `rates = "auto"`: one request at a time ("serial") or a closed loop of
    `concurrency` connections ("saturated")."""

    mode: Literal["rate", "serial", "saturated"]
    rate: float | None = None
    concurrency: int | None = None
    index: int = 0  # its place in the arm's sweep of loads
    # measured requests at this rate instead of the workload's `requests` (or `duration_s`): a load
    # added to narrow the capacity's interval (open_loop.RateSweep.narrow)
    requests: int | None = None

    @property
    def label(self) -> str:
        """The result folder's suffix."""
        more = f"-n{self.requests}" if self.requests else ""
        return (self.mode if self.mode != "rate" or self.rate is None else rate_label(self.rate)) + more

    def meta(self) -> dict[str, Any]:
        """run.json's `load`."""
        out: dict[str, Any] = {"mode": self.mode, "index": self.index}
        if self.rate is not None:
            out["rate"] = self.rate
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.requests is not None:
            out["requests"] = self.requests
        return out


@dataclass(frozen=True)
class ArmSpec:
    """What an arm sends, where, and on which clock: fixed for the arm's life."""

    scenario: Scenario
    arm: Arm
    base_url: str
    model: str
    run_id: str
    server: str  # what the endpoint turned out to be: "vllm", "llama.cpp", ... or "openai"
    clock: ModelClock
    load: Load | None = None  # open loop: the load of this result folder
    context: Context | None = None  # the model's context, where known better than the scenario says
    # fields every body carries, by its max_tokens: those of an engine kvbench started (engines/)
    body_fields: Callable[[int], dict[str, Any]] | None = None

    @property
    def context_bound(self) -> Context:
        return self.context or Context.of(self.scenario)

    @property
    def bust(self) -> bool:
        return self.arm.cache == "bust"

    @property
    def connections(self) -> int:
        """Connections the arm sends on, over all processes: a closed loop's (or an open loop's
        probe's), or as many as an open loop may have in flight."""
        if self.load is not None and self.load.mode != "rate":
            return 1 if self.load.mode == "serial" else self.load.concurrency or 1
        return self.scenario.workload.connections()

    @cached_property
    def url(self) -> str:
        path = "/chat/completions" if self.scenario.endpoint.api == "chat" else "/completions"
        return endpoint.join(self.base_url, path)

    def reuse_lead(self, prompt: Prompt, use: str = "") -> str:
        """The prompt's lead, made this arm's own: arms are separate experiments, so one arm never
        finds the KV another left behind (even where a cache reset leaves offloaded tiers full).
        A `use` ("warmup") makes it that use's own too: nothing of it is shared with the rest."""
        return _arm_lead(self.arm.name, use, prompt.lead)

    def body(
        self, text: str, salt: str | None, max_tokens: int | None = None, engine: dict[str, Any] | None = None
    ) -> bytes:
        """A request's body; `engine`: fields an engine adapter adds (tiers.py)."""
        ep = self.scenario.endpoint
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens or ep.max_tokens,
            "temperature": ep.temperature,
        }
        body.update(ep.extra_body)
        body["stream"] = True
        body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
        if ep.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if salt is not None:
            body["cache_salt"] = salt
        if self.bust and self.server == "llama.cpp":
            body["cache_prompt"] = False  # llama.cpp: do not reuse (or keep) this prompt's KV
        if self.body_fields is not None:
            body.update(self.body_fields(body["max_tokens"]))
        if engine:
            body.update(engine)
        return orjson.dumps(body)

    def record(self, seq: int, ex: Exchange, prompt: Prompt, phase: str, **extra: Any) -> RequestRecord:
        c, st = self.clock, ex.state

        def since_start(t_ns: int | None) -> float | None:
            return None if t_ns is None else c.between(ex.start_ns, t_ns)

        return RequestRecord(
            id=seq,
            arm=self.arm.name,
            phase=phase,
            prompt_id=prompt.id,
            target_tokens=prompt.target_tokens,
            prompt_tokens=st.prompt_tokens,
            cached_tokens=st.cached_tokens,
            emulator_late_s=st.emulator_late_s,
            completion_tokens=st.completion_tokens,
            start_s=c.since_start(ex.start_ns),
            ttft_s=since_start(st.first_token_ns),
            first_byte_s=since_start(st.first_byte_ns),
            first_content_s=since_start(st.first_content_ns),
            headers_s=since_start(ex.headers_ns),
            e2e_s=since_start(ex.end_ns),
            itl_s=c.gaps(st.token_chunk_ns),
            ok=ex.ok,
            error=ex.error,
            error_kind=ex.error_kind,
            http_status=ex.http_status,
            retried=ex.resent,
            attempts=2 if ex.resent else None,
            **_first_token_read(ex, c),
            **extra,
        )


def _first_token_read(ex: Exchange, clock: ModelClock) -> dict[str, Any]:
    """The record's fields of the read that carried the first token (none without a first token)."""
    if ex.state.first_token_ns is None:
        return {}
    late = ex.first_token_late_ns
    return {
        "first_token_stamp": ex.first_token_stamp,
        "first_token_late_s": None if late is None else clock.between(0, late),
        "first_token_shared": ex.first_token_shared or None,
    }


@dataclass
class Sender:
    """Sends an arm's requests; counts what an arm must know while it runs."""

    spec: ArmSpec
    client: StreamingClient
    builder: PromptBuilder
    progress: RunProgress
    stop: aio.Stopping
    rng: random.Random
    seq: int = 0  # the last request id given (worker processes start at their own offset)
    subscribers: list[Callable[[RequestRecord], None]] = field(default_factory=list)
    scraper: Scraper | None = None  # sweeps: server counters around every request
    warnings: list[str] = field(default_factory=list)
    aborted: str | None = None
    in_flight: int = 0
    send_salt: bool = True
    said_no_cached: bool = False
    block: int | None = None  # the server's KV block size, when known (checks.warm_hit)
    off_target: set[str] = field(default_factory=set)
    dead_streak: int = 0
    dead_kinds: set[str] = field(default_factory=set)
    info: dict[str, Any] = field(default_factory=dict)  # what the workload learnt, for run.json

    def warn(self, text: str) -> None:
        text = self.client.redact(text)
        self.warnings.append(text)
        self.progress.console.print(f"[yellow]warning:[/] {escape(text)}", highlight=False)

    def new_lead(self) -> str:
        return prompts.lead(self.rng.randrange(10**prompts.LEAD_DIGITS))

    def lead_for(self, prompt: Prompt) -> str:
        """A bust arm's request is unique; others reuse the prompt's (arm-own) lead."""
        return self.new_lead() if self.spec.bust else self.spec.reuse_lead(prompt)

    async def send(
        self,
        prompt: Prompt,
        phase: str,
        lead_text: str,
        answer: list[str] | None = None,
        engine_fields: dict[str, Any] | None = None,
        kind: KindRecord | None = None,
        **extra: Any,
    ) -> RequestRecord:
        """One request, recorded; `answer` (a list) gets the response's text; `engine_fields` go
        into its body (tiers.py: the engine slot it is pinned to); `kind`: the workload kind's own
        fields of the record (its KindSpec.record)."""
        if kind is not None:
            extra["kind_fields"] = kind.fields()
        spec = self.spec
        self.seq += 1
        seq = self.seq
        salt = lead_text.strip(" []") if spec.bust and spec.scenario.endpoint.send_cache_salt != "never" else None
        request_id = f"{spec.run_id}-{spec.arm.name}-{seq}"
        before = await self.scraper.snapshot() if self.scraper else None
        self.in_flight += 1
        try:
            text, out = prompt.text(lead_text), prompt.max_tokens
            body = spec.body(text, self._salt(salt), out, engine_fields)
            limit = out or spec.scenario.endpoint.max_tokens
            ex = await self.client.stream(spec.url, body, request_id, answer, limit)
            if self._salt_refused(salt, ex):  # refused at once (HTTP 400): sent again without it
                body = spec.body(text, None, out, engine_fields)
                ex = await self.client.stream(spec.url, body, request_id, answer, limit)
                ex.resent = True
        except InFlightCancelled as cut:  # the server has it: its record, then the cancellation
            for notify in self.subscribers:
                notify(spec.record(seq, cut.exchange, prompt, phase, request_id=request_id, **extra))
            raise
        finally:
            self.in_flight -= 1
        record = spec.record(seq, ex, prompt, phase, request_id=request_id, **extra)
        if self.scraper is not None:
            self.scraper.record(phase, before, await self.scraper.snapshot(), [record])
        self._check_length(record)
        for notify in self.subscribers:
            notify(record)
        self._count_dead(ex)
        # What follows (a closed loop's next request) takes its turn with the streams' parsing:
        # streams that end together do not hold the loop in one go. After the record: a
        # cancellation while waiting loses nothing.
        if self.client.turns.spent():
            await self.client.turns.wait()
        return record

    def _salt(self, salt: str | None) -> str | None:
        return salt if self.send_salt else None

    def _salt_refused(self, salt: str | None, ex: Exchange) -> bool:
        if salt is None or self.spec.scenario.endpoint.send_cache_salt != "auto":
            return False
        if ex.http_status not in (400, 422) or "cache_salt" not in (ex.error or ""):
            return False
        if self.send_salt:  # said once; requests already in flight with a salt are sent again too
            self.send_salt = False
            self.warn("the endpoint refuses `cache_salt`; bust requests rely on their unique leading text alone")
        return True

    def _count_dead(self, ex: Exchange) -> None:
        """A dead or hung endpoint stops the arm: it would otherwise take every remaining request
        into its timeout, hours with the default ones. One that failed a liveness probe is dead."""
        if ex.dead is not None and not self.aborted:
            self.aborted = ex.dead
            self.stop.set()
            return
        if ex.error_kind not in DEAD_KINDS:
            self.dead_streak, self.dead_kinds = 0, set()
            return
        self.dead_streak += 1
        self.dead_kinds.add(ex.error_kind)
        if self.dead_streak >= DEAD_ENDPOINT_STREAK and not self.aborted:
            what = " or ".join(DEAD_KINDS[k] for k in sorted(self.dead_kinds))
            self.aborted = f"{self.dead_streak} requests in a row {what}: {ex.error}"
            self.stop.set()

    def _check_length(self, r: RequestRecord) -> None:
        """The server's own count of what was really sent (a bust lead can tokenize differently)."""
        target, got = r.target_tokens, r.prompt_tokens
        off = target and got is not None and abs(got - target) > self.spec.scenario.prompts.tolerance * target
        if off and r.prompt_id not in self.off_target:
            self.off_target.add(r.prompt_id)
            if len(self.off_target) <= LENGTH_WARNINGS:
                self.warn(f"request {r.id} ({r.prompt_id}): the server counted {got} prompt tokens, target {target}")
            elif len(self.off_target) == LENGTH_WARNINGS + 1:
                self.warn(
                    f"more prompts are off their target length than the {LENGTH_WARNINGS} named: compare "
                    "target_tokens with prompt_tokens in requests.jsonl"
                )

    @property
    def cold_allowance(self) -> int:
        """Cached tokens a cold request may report (known once the first prompt is built)."""
        return checks.cold_allowance(self.spec.scenario.workload.shared_prefix(), self.builder.template_tokens)

    def check_cold(self, r: RequestRecord) -> None:
        if r.ok and (r.cached_tokens or 0) > self.cold_allowance:
            self.warn(
                f"request {r.id} ({r.prompt_id}) was meant to be cold but the server reports "
                f"{r.cached_tokens} cached tokens: its cold TTFT is not cold"
            )

    def check_bust(self, r: RequestRecord) -> None:
        if self.spec.bust and r.ok and (r.cached_tokens or 0) > 0:
            self.warn(f"request {r.id} of bust arm {self.spec.arm.name} hit the cache ({r.cached_tokens} tokens)")

    def check_warm(self, r: RequestRecord) -> None:
        if not r.ok or r.prompt_tokens is None:
            return
        if r.cached_tokens is None:
            if not self.said_no_cached:
                self.said_no_cached = True
                self.warn(
                    "the server does not report usage.prompt_tokens_details.cached_tokens, so warm requests "
                    "cannot be verified (vLLM: start it with --enable-prompt-tokens-details)"
                )
            return
        if not checks.warm_hit(r.cached_tokens, r.prompt_tokens, self.block):
            wanted = (
                f"every full {self.block}-token block, {checks.full_blocks(r.prompt_tokens, self.block)}"
                if self.block is not None
                else f"{checks.WARM_CACHED_SHARE:.0%} of them or every full block"
            )
            self.warn(
                f"request {r.id} ({r.prompt_id}) was meant to be warm but only {r.cached_tokens} of "
                f"{r.prompt_tokens} prompt tokens came from cache ({wanted} expected): its warm TTFT is not warm"
            )

    async def build(self, prompt_id: str, target: int, shared: str = "") -> Prompt:
        prompt = await self.builder.build(prompt_id, target, shared)
        if not self.builder.within_tolerance(prompt):
            self.warn(
                f"prompt {prompt_id}: {prompt.tokens} tokens, target {target} "
                f"(outside ±{self.spec.scenario.prompts.tolerance:.1%})"
            )
        return prompt


@dataclass(frozen=True)
class Timed:
    """A schedule sent on time (an open loop's arrivals, a trace at its timestamps): each schedule
    index's send time (model s after the arm's start), and how many of the first are a warm-up,
    sent but not counted (the measured part starts once they are answered)."""

    times: tuple[float, ...]
    warmup: int = 0


Own = TypeVar("Own")


@dataclass(frozen=True)
class Plan(Generic[Own]):
    """What a workload settles before the arm's clock starts: its prompts and its schedule of
    (schedule index, prompt index) pairs; when each is sent, where the schedule is timed (None:
    as fast as the connections take them); what run.json records of it (a trace's); and what the
    kind plans beyond that, its own type (`own`: the sessions kind's conversations). Arms of one
    run share it."""

    total: int  # requests the arm will send
    prompts: tuple[Prompt, ...] = ()
    schedule: tuple[tuple[int, int], ...] = ()
    timed: Timed | None = None
    info: dict[str, Any] = field(default_factory=dict)
    own: Own | None = None


class Schedule(AsyncIterator[tuple[int, int]]):
    """Where connections take the next (schedule index, prompt index) pair, and where an open
    loop's processes agree on when its measured part starts (after the warm-up is answered).
    Asynchronous: several processes or hosts may share one (distributed/dispatch.py FedOrder)."""

    def __init__(self, order: Iterable[tuple[int, int]]) -> None:
        self.order = iter(order)

    async def __anext__(self) -> tuple[int, int]:
        try:
            return next(self.order)
        except StopIteration:
            raise StopAsyncIteration from None

    async def measured_start(self, ready_ns: int) -> int:
        """Given when this process is ready for the measured part (its warm-up answered), when
        the measured part starts for all (monotonic ns). One process: at once."""
        return ready_ns


async def build_pool(sender: Sender, w: PoolConfig) -> tuple[Prompt, ...]:
    """The prompt pool of closed and open loops: from the prompts file, or synthetic prompts of
    the drawn lengths around the shared prefix."""
    sc = sender.spec.scenario
    if sc.prompts.source == "file":
        assert sc.prompts.path is not None
        found = prompts.load_file(sc.prompts.path, sender.builder)
        if len(found) < w.pool:
            sender.warn(f"{sc.prompts.path} holds {len(found)} prompts, fewer than the pool of {w.pool}")
        return tuple(found[i % len(found)] for i in range(w.pool))
    lengths = w.lengths(sc.prompts.seed)
    sender.progress.note(f"building {w.pool} prompts")
    shared = await sender.builder.shared_prefix(w.shared_prefix_tokens)
    return tuple([await sender.build(f"p{i:05d}", n, shared) for i, n in enumerate(lengths)])
