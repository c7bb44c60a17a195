"""`kind = "trace"`: a request trace (Mooncake or Qwen-Bailian, harness/traces.py) replayed: at
its timestamps (divided by `speed`, sent as open_loop.py sends), or with `concurrency` as fast as
that many connections allow (as closed_loop.py sends). Each request's prompt is built from the
trace's hash_ids, so requests sharing leading ids share that text (prompts.BlockPrompts), with the
trace's input length as its target and its output length as max_tokens. A bust arm gives every
request a lead of its own: nothing can come from a cache. run.json records the trace and the
reuse it makes possible, for the report's "captured" figure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness import traces
from harness.errors import InputError
from harness.prompts import BlockPrompts
from harness.workloads import closed_loop, open_loop
from harness.workloads.base import Plan, Schedule, Sender

NAME = "trace"
SHARES_SCHEDULE = True


def select(
    reqs: Sequence[traces.TraceRequest], start_s: float, end_s: float | None, cap: int | None
) -> list[traces.TraceRequest]:
    """The slice replayed: [start_s, end_s) after the trace's first request, at most `cap`."""
    t0 = reqs[0].timestamp_s
    out = [r for r in reqs if start_s <= r.timestamp_s - t0 and (end_s is None or r.timestamp_s - t0 < end_s)]
    return out[:cap] if cap is not None else out


async def plan(sender: Sender, prior: Plan | None = None) -> Plan:
    w = sender.spec.scenario.workload
    assert w.path is not None
    context = sender.spec.context_bound
    trace = traces.read(w.path, w.trace_format, w.block_tokens, w.skip_bad, context.tokens, f", {context.source}")
    if (misfits := trace.misfit_warning()) is not None:
        sender.warn(misfits)
    if trace.skipped:
        n = len(trace.skipped)
        more = f" (and {n - 1} more)" if n > 1 else ""
        lines = "lines" if n > 1 else "line"
        sender.warn(f"{n} bad {lines} of the trace skipped (skip_bad = true): {trace.skipped[0]}{more}")
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


async def drive(
    sender: Sender,
    plan: Plan,
    take: Schedule | None = None,
    connections: int | None = None,
    first: int = 0,
) -> None:
    if sender.spec.scenario.workload.closed:
        await closed_loop.drive(sender, plan, take, connections, first)
    else:
        await open_loop.send_timed(sender, plan, take, None, connections)
