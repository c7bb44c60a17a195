"""`kind = "trace"`: a request trace (Mooncake or Qwen-Bailian, harness/inputs/traces.py) replayed: at
its timestamps (divided by `speed`, sent as open_loop.py sends), or with `concurrency` as fast as
that many connections allow (as closed_loop.py sends). Each request's prompt is built from the
trace's hash_ids, so requests sharing leading ids share that text (prompts.BlockPrompts), with the
trace's input length as its target and its output length as max_tokens. A bust arm gives every
request a lead of its own: nothing can come from a cache. run.json records the trace and the
reuse it makes possible, for the report's "captured" figure."""

from __future__ import annotations

from typing import Any

from harness.config.kinds.trace import TraceConfig, select
from harness.core.errors import InputError
from harness.inputs import traces
from harness.inputs.prompts import BlockPrompts
from harness.workloads import closed_loop, open_loop
from harness.workloads.base import Plan, Schedule, Sender, Timed
from harness.workloads.kind import Driver


class Trace(Driver[TraceConfig]):
    config = TraceConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        return await plan(self.cfg(sender.spec.scenario), sender)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        if self.cfg(sender.spec.scenario).closed:
            await closed_loop.drive(sender, plan, take, connections, first)
        else:
            await open_loop.send_timed(sender, plan, take, None, connections)


DRIVER = Trace()


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
    timed = None if w.closed else Timed(tuple((r.timestamp_s - t0) / w.speed for r in reqs))
    return Plan(
        len(reqs),
        prompts,
        tuple((i, i) for i in range(len(reqs))),
        timed,
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
