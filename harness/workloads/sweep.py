"""`kind = "sweep"`: per length and repetition, one cold request (a fresh prompt) then
`warm_repeats` requests of the same prompt, one request in flight at a time so that queueing
never pollutes TTFT. Prompts are built as the sweep reaches them (between requests). An arm's
`warm_from` puts the prompt's KV in a lower tier before each warm request (tiers.py)."""

from __future__ import annotations

from harness.config.kinds.sweep import SweepConfig
from harness.engines import tiers
from harness.workloads.base import Plan, Schedule, Sender
from harness.workloads.kind import Driver


class Sweep(Driver[SweepConfig]):
    config = SweepConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        w = self.cfg(sender.spec.scenario)
        return Plan(total=len(w.lengths) * w.repetitions * (1 + w.warm_repeats))

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        tier = None
        if (sp := sender.spec).arm.warm_from != "active":
            other = await sender.build("push-out", tiers.PUSH_OUT_TOKENS)
            lead = other.text(sender.new_lead())
            tier = tiers.adapter(sp.arm, sp.server, sp.base_url, sp.run_id, sender.client.session, lead)
        try:
            await _lengths(self.cfg(sender.spec.scenario), sender, tier)
        finally:
            if tier is not None:
                sender.info["tiers"] = await tier.finish()


DRIVER = Sweep()


async def _lengths(w: SweepConfig, sender: Sender, tier: tiers.Adapter | None) -> None:
    bust = sender.spec.bust
    fields = tier.body_fields() if tier is not None else None  # its slot
    for length in w.lengths:
        for rep in range(w.repetitions):
            if sender.stop.is_set():
                return
            sender.progress.note(f"building a {length}-token prompt")
            prompt = await sender.build(f"L{length}-r{rep}", length)
            lead = sender.lead_for(prompt)
            sender.check_cold(await sender.send(prompt, "cold", lead, engine_fields=fields, repeat=0))
            if tier is not None:
                await tier.after_cold(prompt.id)
            for i in range(w.warm_repeats):
                if sender.stop.is_set():
                    return
                if bust:  # every request unique: all of them are cold
                    sender.check_cold(await sender.send(prompt, "cold", sender.new_lead(), repeat=i + 1))
                    continue
                step = await tier.before_warm(prompt.id) if tier is not None else None
                extra = step.fields(sender.spec.arm.warm_from) if step is not None else {}
                sender.check_warm(await sender.send(prompt, "warm", lead, engine_fields=fields, repeat=i + 1, **extra))
