"""`kind = "trace"`: a request trace (Mooncake or Qwen-Bailian, harness/inputs/traces.py) replayed: at
its timestamps (divided by `speed`, sent as open_loop.py sends), or with `concurrency` as fast as
that many connections allow (as closed_loop.py sends). Each request's prompt is built from the
trace's hash_ids, so requests sharing leading ids share that text (prompts.BlockPrompts), with the
trace's input length as its target and its output length as max_tokens. A bust arm gives every
request a lead of its own: nothing can come from a cache. run.json records the trace and the
reuse it makes possible, for the report's "captured" figure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

from harness.config.kinds import WorkloadConfig
from harness.config.scenario import Context
from harness.config.tables import Table
from harness.core.errors import InputError
from harness.inputs import traces
from harness.inputs.prompts import BlockPrompts
from harness.workloads import closed_loop, open_loop
from harness.workloads.base import OPEN_LOOP_CONNECTIONS, Plan, Schedule, Sender
from harness.workloads.kind import ReusesAcrossRequests


@dataclass(frozen=True, kw_only=True)
class TraceConfig(WorkloadConfig):
    kind: str = "trace"
    path: str
    trace_format: Literal["auto", "mooncake", "bailian"] = "auto"
    block_tokens: int | None = None  # tokens per hash_ids block (default: the format's)
    speed: float = 1.0  # timestamps replayed this many times faster
    start_s: float = 0.0  # the slice of the trace replayed: [start_s, end_s) after its first request
    end_s: float | None = None
    max_requests: int | None = None
    skip_bad: bool = False  # leave bad trace lines out (counted) instead of stopping
    lru_blocks: tuple[int, ...] = ()  # also the reuse possible with LRU caches of these many trace blocks
    concurrency: int | None = None  # as fast as that many connections allow, instead of the timestamps

    @classmethod
    def parse(cls, t: Table) -> Self:
        concurrency = t.integer("concurrency", None, minimum=1, what="an integer number of connections")
        if concurrency is not None and t.has("speed"):
            t.fail("speed", "applies when the trace's timestamps are kept (no concurrency)", t.data["speed"])
        w = cls(
            path=t.text("path", required=True),
            trace_format=t.text("format", cls.trace_format, ("auto", "mooncake", "bailian")),
            block_tokens=t.integer("block_tokens", None, minimum=1, what="an integer number of tokens"),
            speed=t.number("speed", cls.speed, positive=True),
            start_s=t.number("start_s", cls.start_s, minimum=0.0),
            end_s=t.number("end_s", 0.0, positive=True) or None,
            max_requests=t.integer("max_requests", None, minimum=1, what="an integer number of requests"),
            skip_bad=t.flag("skip_bad", cls.skip_bad),
            lru_blocks=_lru_blocks(t),
            concurrency=concurrency,
        )
        if w.end_s is not None and w.end_s <= w.start_s:
            t.fail("end_s", f"expected more than start_s ({w.start_s:g})", w.end_s)
        return w

    @property
    def closed(self) -> bool:
        """`concurrency` given: as fast as that many connections allow."""
        return self.concurrency is not None

    def check_files(self, scenario_path: str) -> None:
        if not Path(self.path).is_file():
            raise InputError(
                f"{scenario_path}: workload.path: no trace file {self.path!r} "
                "(paths are relative to the current directory)"
            )

    def connections(self) -> int:
        return self.concurrency or OPEN_LOOP_CONNECTIONS

    def read(self, context: Context) -> tuple[traces.Trace, list[str]]:
        """The trace, every line checked against the model's context, and what to warn of it."""
        trace = traces.read(
            self.path, self.trace_format, self.block_tokens, self.skip_bad, context.tokens, f", {context.source}"
        )
        warnings = [w for w in (trace.misfit_warning(),) if w is not None]
        if trace.skipped:
            n = len(trace.skipped)
            more = f" (and {n - 1} more)" if n > 1 else ""
            lines = "lines" if n > 1 else "line"
            warnings.append(f"{n} bad {lines} of the trace skipped (skip_bad = true): {trace.skipped[0]}{more}")
        return trace, warnings

    def check_inputs(self, context: Context) -> tuple[str, list[str]]:
        trace, warnings = self.read(context)
        return f"trace {self.path}: {len(trace.requests):,} requests", warnings

    def output_lengths(self, out: int, context: Context) -> frozenset[int]:
        trace, _ = self.read(context)  # (its warnings are the run's to give)
        replayed = select(trace.requests, self.start_s, self.end_s, self.max_requests)
        return frozenset(r.output_length or out for r in replayed)


def _lru_blocks(t: Table) -> tuple[int, ...]:
    v = t.get("lru_blocks")
    if v is None:
        return ()
    if not isinstance(v, list) or not v:
        t.fail("lru_blocks", "expected a non-empty list of cache sizes in trace blocks", v)
    return tuple(
        sorted({t.check_int(f"lru_blocks[{i}]", n, 1, "an integer number of blocks") for i, n in enumerate(v)})
    )


class Trace(ReusesAcrossRequests[TraceConfig]):
    name = "trace"
    config = TraceConfig
    report_sections = ("reuse", "versus_recompute")

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        return await plan(self.cfg(sender.spec.scenario), sender)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        if self.cfg(sender.spec.scenario).closed:
            await closed_loop.drive(sender, plan, take, connections, first)
        else:
            await open_loop.send_timed(sender, plan, take, None, connections)


KIND = Trace()


def select(
    reqs: Sequence[traces.TraceRequest], start_s: float, end_s: float | None, cap: int | None
) -> list[traces.TraceRequest]:
    """The slice replayed: [start_s, end_s) after the trace's first request, at most `cap`."""
    t0 = reqs[0].timestamp_s
    out = [r for r in reqs if start_s <= r.timestamp_s - t0 and (end_s is None or r.timestamp_s - t0 < end_s)]
    return out[:cap] if cap is not None else out


async def plan(w: TraceConfig, sender: Sender) -> Plan:
    trace, warnings = w.read(sender.spec.context_bound)
    for warning in warnings:
        sender.warn(warning)
    reqs = select(trace.requests, w.start_s, w.end_s, w.max_requests)
    if not reqs:
        raise InputError(f"{w.path}: no request in the slice start_s = {w.start_s:g}, end_s = {w.end_s}")
    sender.progress.note(f"building {len(reqs):,} prompts from {w.path}")
    blocks = BlockPrompts(
        sender.builder, trace.block_tokens, aligned=sender.spec.scenario.endpoint.api == "completions"
    )
    lead = sender.builder.reuse_lead("trace")
    await blocks.calibrate(lead)
    prompts = tuple(blocks.prompt(f"t{r.line}", lead, r.hash_ids, r.input_length, r.output_length) for r in reqs)
    t0 = reqs[0].timestamp_s
    times = () if w.closed else tuple((r.timestamp_s - t0) / w.speed for r in reqs)
    return Plan(
        len(reqs),
        prompts,
        tuple((i, i) for i in range(len(reqs))),
        times,
        info={"trace": _info(trace, reqs, w.lru_blocks, sender.block, 0 if blocks.aligned_head else blocks.fixed)},
    )


def _info(
    trace: traces.Trace,
    reqs: list[traces.TraceRequest],
    lru_blocks: tuple[int, ...],
    server_block: int | None,
    head: int,
) -> dict[str, Any]:
    """run.json's `trace`. The possible reuse is counted in the server's blocks where its block
    size is known (the prompts as kvbench builds them, their shared head included: what the
    server could report cached at most), else in the trace's own blocks."""
    in_trace_blocks = traces.reuse(reqs, trace.block_tokens)
    possible = in_trace_blocks
    basis = f"the trace's {trace.block_tokens}-token blocks (the server's block size is not known)"
    if server_block is not None:
        possible = traces.reuse_served(reqs, trace.block_tokens, server_block, head)
        basis = f"the server's {server_block}-token blocks, over the prompts as built ({head} head tokens shared)"
    return {
        "possible_lru": [
            {"capacity_blocks": n, "cached_share": traces.reuse(reqs, trace.block_tokens, n).share} for n in lru_blocks
        ],
        "file": trace.path,
        "format": trace.format,
        "block_tokens": trace.block_tokens,
        "requests": len(reqs),
        "skipped_lines": len(trace.skipped),
        "possible_cached_share": possible.share,
        "possible_cached_tokens": possible.cached_tokens,
        "possible_basis": basis,
        "possible_in_trace_blocks_share": in_trace_blocks.share,
        "prompt_tokens": possible.prompt_tokens,
    }
