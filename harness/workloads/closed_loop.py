"""`kind = "closed_loop"`: `concurrency` connections each take the next request of one schedule
drawn (seeded) before the run, `requests` picks from a pool of `pool` prompts, until all are
sent. With `--workers N` the processes share the schedule (workers.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

from harness import prompts
from harness.workloads.base import Plan, Sender, draw_length

NAME = "closed_loop"
SHARES_SCHEDULE = True


async def plan(sender: Sender) -> Plan:
    sc = sender.spec.scenario
    w = sc.workload
    rng = random.Random(f"{sc.prompts.seed}/schedule")
    schedule = tuple((i, rng.randrange(w.pool)) for i in range(w.requests))
    if sc.prompts.source == "file":
        assert sc.prompts.path is not None
        found = prompts.load_file(sc.prompts.path, sender.builder)
        if len(found) < w.pool:
            sender.warn(f"{sc.prompts.path} holds {len(found)} prompts, fewer than the pool of {w.pool}")
        return Plan(len(schedule), tuple(found[i % len(found)] for i in range(w.pool)), schedule)
    assert w.prompt_tokens is not None
    rng = random.Random(f"{sc.prompts.seed}/pool-lengths")
    lengths = [draw_length(w.prompt_tokens, rng) for _ in range(w.pool)]
    sender.progress.note(f"building {w.pool} prompts")
    shared = await sender.builder.shared_prefix(w.shared_prefix_tokens)
    pool = [await sender.build(f"p{i:05d}", n, shared) for i, n in enumerate(lengths)]
    return Plan(len(schedule), tuple(pool), schedule)


async def drive(
    sender: Sender,
    plan: Plan,
    take: Iterator[tuple[int, int]] | None = None,
    connections: int | None = None,
    first: int = 0,
) -> None:
    """`take`: where each connection gets its next (schedule index, prompt index) pair (default:
    the plan's schedule; workers.py passes one shared by all processes); `connections`: how many
    (default: the scenario's concurrency), numbered from `first`."""
    queue = take if take is not None else iter(plan.schedule)
    spec = sender.spec

    async def connection(n: int) -> None:
        for i, p in queue:
            if sender.stop.is_set():
                return
            prompt = plan.prompts[p]
            r = await sender.send(prompt, "run", sender.lead_for(prompt), worker=n, schedule_index=i)
            if spec.bust and r.ok and (r.cached_tokens or 0) > 0:
                sender.warn(f"request {r.id} of bust arm {spec.arm.name} hit the cache ({r.cached_tokens} tokens)")

    count = connections or spec.scenario.workload.concurrency
    await asyncio.gather(*(connection(first + n) for n in range(count)))
