"""A workload kind from outside kvbench, in one file, as a plugin package would ship it
(tests/test_kinds.py registers `SPEC` through the `kvbench.workloads` entry point group): its
config and spec, its figures and its driver, the three parts kvbench's own kinds keep in three
layers (config/kinds/__init__.py).

`kind = "bursts"`: `bursts` bursts of `size` requests of one prompt, all of a burst sent at once,
`gap_s` (model seconds) between the end of one burst and the next; each burst has a prompt of
its own of `prompt_tokens`. What it shows: how much the requests of a burst differ in TTFT when
they all want the same prefix at the same time (`burst_ttft_spread`: the median over bursts of
the slowest TTFT minus the fastest)."""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any, Self

from harness.analysis import stats
from harness.analysis.kinds import Figures, GateFigures, Section
from harness.config.kinds import KindSpec, WorkloadConfig
from harness.config.tables import Table
from harness.results import RequestRecord, RunResult
from harness.workloads.base import Plan, Schedule, Sender
from harness.workloads.kind import Driver


@dataclass(frozen=True, kw_only=True)
class BurstsConfig(WorkloadConfig):
    kind: str = "bursts"
    bursts: int
    size: int
    prompt_tokens: int
    gap_s: float = 0.0

    @classmethod
    def parse(cls, t: Table) -> Self:
        return cls(
            bursts=t.integer("bursts", required=True, minimum=1, what="an integer number of bursts"),
            size=t.integer("size", required=True, minimum=1, what="an integer number of requests per burst"),
            prompt_tokens=t.integer("prompt_tokens", required=True, minimum=1, what="an integer number of tokens"),
            gap_s=t.number("gap_s", cls.gap_s, minimum=0.0),
        )

    def connections(self) -> int:
        return self.size

    def longest_prompts(self, out: int) -> list[tuple[str, int, str]]:
        return [("workload.prompt_tokens", self.prompt_tokens + out, "")]


def by_burst(records: stats.Records) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = {}
    for r in records:
        out.setdefault(r.prompt_id, []).append(r)
    return out


def spread(records: stats.Records) -> float | None:
    gaps = []
    for burst in by_burst(stats.ok(records)).values():
        ttft = stats.values(burst, "ttft_s")
        if len(ttft) > 1:
            gaps.append(float(ttft.max() - ttft.min()))
    return statistics.median(gaps) if gaps else None


SPEC = KindSpec(
    name="bursts",
    config=BurstsConfig,
    figures="tests.toy_kind:FIGURES",
    driver="tests.toy_kind:DRIVER",
    shares_schedule=False,
    report_sections=("versus_recompute",),
    gate_metrics=("burst_ttft_spread",),
)


class Bursts(Driver[BurstsConfig]):
    config = BurstsConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        w = self.cfg(sender.spec.scenario)
        prompts = prior.prompts if prior is not None else ()
        if not prompts:
            prompts = tuple([await sender.build(f"burst{b}", w.prompt_tokens) for b in range(w.bursts)])
        schedule = tuple((b * w.size + k, b) for b in range(w.bursts) for k in range(w.size))
        return Plan(len(schedule), prompts, schedule)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        w = self.cfg(sender.spec.scenario)
        for b in range(w.bursts):
            if sender.stop.is_set():
                return
            prompt = plan.prompts[b]
            lead = sender.lead_for(prompt)
            sends = (sender.send(prompt, "run", lead, worker=k, schedule_index=b * w.size + k) for k in range(w.size))
            await asyncio.gather(*sends)
            await asyncio.sleep(sender.spec.clock.wall_s(w.gap_s))


class BurstsFigures(Figures):
    def figures(self, records: stats.Records, counted: stats.Records, slo: dict[str, float] | None) -> dict[str, Any]:
        return {"bursts": len(by_burst(counted)), "burst_ttft_spread_s": spread(counted)}

    def lines(self, s: dict[str, Any]) -> list[str]:
        return [f"{s['bursts']} bursts, TTFT spread within a burst (median) {s['burst_ttft_spread_s']} s"]

    def gate_figures(self, run: RunResult) -> GateFigures:
        out = super().gate_figures(run)
        if (x := spread(run.records)) is not None:
            out[("burst_ttft_spread", None)] = x
        return out

    def sections(self, runs: list[RunResult]) -> list[Section]:
        rows = []
        for run in runs:
            for name, burst in by_burst(run.records).items():
                ttft = stats.values(stats.ok(burst), "ttft_s")
                rows.append((run.label, name, len(burst), stats.percentile(ttft, 0), stats.percentile(ttft, 100)))
        return [
            Section(
                "Bursts: one prompt wanted by many at once",
                "Each burst sends its requests of one prompt together; fastest and slowest TTFT of each.",
                ("run", "burst", "requests", "fastest TTFT (s)", "slowest TTFT (s)"),
                tuple(rows),
            )
        ]


DRIVER = Bursts()
FIGURES = BurstsFigures()
