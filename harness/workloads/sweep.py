"""`kind = "sweep"`: per length and repetition, one cold request (a fresh prompt) then
`warm_repeats` requests of the same prompt, one request in flight at a time so that queueing
never pollutes TTFT. Prompts are built as the sweep reaches them (between requests). An arm's
`warm_from` puts the prompt's KV in a lower tier before each warm request (tiers.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from rich.console import Console
from rich.table import Table as RichTable

from harness.analysis import stats
from harness.config.kinds import WorkloadConfig
from harness.config.scenario import Scenario
from harness.config.tables import Table
from harness.core.errors import InputError
from harness.engines import tiers
from harness.monitor import progress
from harness.results import RunResult
from harness.workloads.base import Plan, Schedule, Sender
from harness.workloads.kind import GateFigures, WorkloadKind


@dataclass(frozen=True, kw_only=True)
class SweepConfig(WorkloadConfig):
    kind: str = "sweep"
    lengths: tuple[int, ...]
    warm_repeats: int = 1
    repetitions: int = 1

    @classmethod
    def parse(cls, t: Table) -> Self:
        lengths = t.required("lengths", "a list of prompt lengths in tokens")
        if not isinstance(lengths, list) or not lengths:
            t.fail("lengths", "expected a non-empty list of prompt lengths in tokens", lengths)
        return cls(
            lengths=tuple(
                t.check_int(f"lengths[{i}]", v, 1, "an integer number of tokens") for i, v in enumerate(lengths)
            ),
            warm_repeats=t.integer("warm_repeats", cls.warm_repeats, minimum=0),
            repetitions=t.integer("repetitions", cls.repetitions, minimum=1),
        )

    def check(self, sc: Scenario) -> None:
        if sc.prompts.source == "file":
            raise InputError(
                f'{sc.path}: prompts.source: a sweep builds its own prompts; "file" works with the other kinds'
            )

    def longest_prompts(self, out: int) -> list[tuple[str, int, str]]:
        return [(f"workload.lengths[{i}]", n + out, "") for i, n in enumerate(self.lengths)]


class Sweep(WorkloadKind[SweepConfig]):
    name = "sweep"
    config = SweepConfig
    shares_schedule = False  # each warm request follows its cold one: one connection
    per_length = True
    report_sections = ("by_length",)

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        w = self.cfg(sender.spec.scenario)
        return Plan(total=len(w.lengths) * w.repetitions * (1 + w.warm_repeats))

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        tier = None
        if sender.spec.arm.warm_from != "active":
            other = await sender.build("push-out", tiers.PUSH_OUT_TOKENS)
            tier = tiers.adapter(sender.spec, sender.client.session, other.text(sender.new_lead()))
        try:
            await _lengths(self.cfg(sender.spec.scenario), sender, tier)
        finally:
            if tier is not None:
                sender.info["tiers"] = await tier.finish()

    def summary(self, records: stats.Records, slo: dict[str, float] | None = None) -> dict[str, Any]:
        return {**stats.summary(records), "by_length": stats.sweep_rows(records)}

    def show(self, console: Console, heading: str, s: dict[str, Any], unit: str) -> None:
        t = RichTable(title=f"{heading}: TTFT by prompt length{unit}")
        for col in ("tokens", "cold p50 s", "warm p50 s", "speedup", "n cold/warm"):
            t.add_column(col, justify="right")
        for row in s["by_length"]:
            t.add_row(
                f"{row['length']:,}",
                progress.fmt(row["cold_ttft_p50_s"]),
                progress.fmt(row["warm_ttft_p50_s"]),
                f"{row['speedup']:.1f}x" if row["speedup"] else "-",
                f"{row['cold_n']}/{row['warm_n']}",
            )
        console.print(t)
        if s.get("ttft_includes_restore"):
            console.print(f"  {stats.RESTORE_NOTE}", markup=False)

    def gate_figures(self, run: RunResult) -> GateFigures:
        """The speedup per length."""
        return {
            ("speedup", int(row["length"])): float(row["speedup"])
            for row in stats.sweep_rows(run.records)
            if row["speedup"]
        }


KIND = Sweep()


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
