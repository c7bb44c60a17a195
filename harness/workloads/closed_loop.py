"""`kind = "closed_loop"`: `concurrency` connections each take the next request of one schedule
drawn (seeded) before the run, `requests` picks from a pool of `pool` prompts, until all are
sent. With `--workers N` the processes share the schedule (workers.py)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

from harness.workloads.base import Plan, Sender, build_pool

NAME = "closed_loop"
SHARES_SCHEDULE = True


async def plan(sender: Sender, prior: Plan | None = None) -> Plan:
    sc = sender.spec.scenario
    rng = random.Random(f"{sc.prompts.seed}/schedule")
    schedule = tuple((i, rng.randrange(sc.workload.pool)) for i in range(sc.workload.requests))
    pool = prior.prompts if prior is not None else await build_pool(sender)
    return Plan(len(schedule), pool, schedule)


async def drive(
    sender: Sender,
    plan: Plan,
    take: Iterator[tuple[int, int]] | None = None,
    connections: int | None = None,
    first: int = 0,
) -> None:
    """`take`: where each connection gets its next (schedule index, prompt index) pair (default:
    the plan's schedule; workers.py passes one shared by all processes); `connections`: how many
    (default: all of the arm's; a process of several gets its share, maybe none), numbered from
    `first`."""
    queue = take if take is not None else iter(plan.schedule)

    async def connection(n: int) -> None:
        for i, p in queue:
            if sender.stop.is_set():
                return
            prompt = plan.prompts[p]
            sender.check_bust(await sender.send(prompt, "run", sender.lead_for(prompt), worker=n, schedule_index=i))

    count = sender.spec.connections if connections is None else connections
    await asyncio.gather(*(connection(first + n) for n in range(count)))
