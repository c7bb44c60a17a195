"""`kind = "closed_loop"`: `concurrency` connections each take the next request of one schedule
drawn (seeded) before the run, `requests` picks from a pool of `pool` prompts, until all are
sent. With `--workers N` the processes share the schedule (distributed/). An arm's
`warm_from = "disk"` has each connection keep to an engine slot of its own, and every request of a
prompt computed before come back from that prompt's slot file (tiers.py)."""

from __future__ import annotations

from harness.config.kinds.closed_loop import ClosedLoopConfig
from harness.core import aio
from harness.engines import tiers
from harness.workloads.base import Plan, Schedule, Sender, build_pool
from harness.workloads.kind import Driver


class ClosedLoop(Driver[ClosedLoopConfig]):
    config = ClosedLoopConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        sc = sender.spec.scenario
        w = self.cfg(sc)
        schedule = tuple(enumerate(w.schedule_picks(sc.prompts.seed)))
        pool = prior.prompts if prior is not None else await build_pool(sender, w)
        return Plan(len(schedule), pool, schedule)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        await drive(sender, plan, take, connections, first)


DRIVER = ClosedLoop()


async def drive(
    sender: Sender,
    plan: Plan,
    take: Schedule | None = None,
    connections: int | None = None,
    first: int = 0,
) -> None:
    """`take`: where each connection gets its next (schedule index, prompt index) pair (default:
    the plan's schedule; a distributed arm passes its worker's share); `connections`: how many
    (default: all of the arm's; a process of several gets its share, maybe none), numbered from
    `first`."""
    queue = take if take is not None else Schedule(plan.schedule)
    count = sender.spec.connections if connections is None else connections
    tier = None
    if (sp := sender.spec).arm.warm_from != "active":
        tier = tiers.adapter(sp.arm, sp.server, sp.base_url, sp.run_id, sender.client.session, "")
        await tier.check_slots(first + count)

    async def connection(n: int, collector: aio.Collections) -> None:
        async for i, p in queue:
            if sender.stop.is_set():
                return
            collector.in_gap(aio.GAP_COLLECT_NS)  # (no schedule: any moment between requests is a gap)
            prompt = plan.prompts[p]
            lead = sender.lead_for(prompt)
            if tier is None:
                sender.check_bust(await sender.send(prompt, "run", lead, worker=n, schedule_index=i))
                continue
            fields, again = tier.body_fields(n), tier.saved_file(prompt.id)
            extra = (await tier.before_warm(prompt.id, n)).fields(sender.spec.arm.warm_from) if again else {}
            r = await sender.send(prompt, "run", lead, engine_fields=fields, worker=n, schedule_index=i, **extra)
            if r.ok and not again:  # computed here: its KV goes to the prompt's file
                await tier.after_cold(prompt.id, n)

    try:
        with aio.collections_in_gaps() as collector:
            await aio.together(*(connection(first + n, collector) for n in range(count)))
    finally:
        if tier is not None:
            sender.info["tiers"] = await tier.finish()
