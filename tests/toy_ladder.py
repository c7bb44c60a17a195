"""A second workload kind from one file, with its own per-request record fields and its own report
section (issue 54: a kind needs no other file for either).

`kind = "ladder"`: one prompt per rung of `rungs` (prompt lengths, in order), each sent `repeats`
times one after the other: the first finds nothing cached, the others find the first's KV. Each
request's record carries its rung, the rung's length and its repeat as `LadderRecord`, the kind's
own fields (results.KindRecord): requests.jsonl holds them under `kind_fields`, exports give
them as `ladder.rung`, `ladder.rung_tokens`, `ladder.repeat`, and the kind's section reads them
back typed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Self

from harness.analysis import stats
from harness.analysis.kinds import Figures, Section, document
from harness.analysis.kinds.document import Flag, Heading, Line, Lines, Paragraph
from harness.config.kinds import KindSpec, WorkloadConfig
from harness.config.tables import Table
from harness.results import KindRecord, RequestRecord, RunResult
from harness.workloads.base import Plan, Schedule, Sender
from harness.workloads.kind import Driver


@dataclass(frozen=True, kw_only=True)
class LadderConfig(WorkloadConfig):
    kind: str = "ladder"
    rungs: tuple[int, ...]
    repeats: int = 2

    @classmethod
    def parse(cls, t: Table) -> Self:
        rungs = t.required("rungs", "a list of prompt lengths (tokens)")
        if not isinstance(rungs, list) or not rungs or not all(type(n) is int and n > 0 for n in rungs):
            t.fail("rungs", "expected a list of prompt lengths (integers > 0)", rungs)
        return cls(
            rungs=tuple(rungs),
            repeats=t.integer("repeats", cls.repeats, minimum=2, what="an integer number of sends per rung"),
        )

    def connections(self) -> int:
        return 1

    def longest_prompts(self, out: int) -> list[tuple[str, int, str]]:
        return [("workload.rungs", max(self.rungs) + out, "")]


@dataclass(frozen=True)
class LadderRecord(KindRecord):
    """What a ladder's request record says of its own: which rung, how long its prompt, which send."""

    rung: int
    rung_tokens: int
    repeat: int


SPEC = KindSpec(
    name="ladder",
    config=LadderConfig,
    figures="tests.toy_ladder:FIGURES",
    driver="tests.toy_ladder:DRIVER",
    shares_schedule=False,
    record=LadderRecord,
)


class Ladder(Driver[LadderConfig]):
    config = LadderConfig

    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        w = self.cfg(sender.spec.scenario)
        prompts = prior.prompts if prior is not None else ()
        if not prompts:
            prompts = tuple([await sender.build(f"rung{k}", n) for k, n in enumerate(w.rungs)])
        schedule = tuple((k * w.repeats + r, k) for k in range(len(w.rungs)) for r in range(w.repeats))
        return Plan(len(schedule), prompts, schedule)

    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        w = self.cfg(sender.spec.scenario)
        for k, n in enumerate(w.rungs):
            prompt = plan.prompts[k]
            lead = sender.lead_for(prompt)
            for r in range(w.repeats):
                if sender.stop.is_set():
                    return
                await sender.send(prompt, "run", lead, kind=LadderRecord(k, n, r), schedule_index=k * w.repeats + r)


def by_rung(records: stats.Records) -> dict[int, tuple[int, list[RequestRecord], list[RequestRecord]]]:
    """rung -> (its prompt length, its first sends, its repeats), from each record's own fields."""
    out: dict[int, tuple[int, list[RequestRecord], list[RequestRecord]]] = {}
    for r in records:
        mine = LadderRecord.of(r)
        if mine is not None:
            _, first, again = out.setdefault(mine.rung, (mine.rung_tokens, [], []))
            (again if mine.repeat else first).append(r)
    return out


class LadderFigures(Figures):
    def figures(self, records: stats.Records, counted: stats.Records, slo: dict[str, float] | None) -> dict[str, Any]:
        return {"rungs": len(by_rung(counted))}

    def lines(self, s: dict[str, Any]) -> list[str]:
        return [f"{s['rungs']} rungs"]

    def sections(self, runs: list[RunResult]) -> list[Section]:
        rows: list[tuple[Any, ...]] = []
        for run in runs:
            for rung, (tokens, first, again) in sorted(by_rung(stats.ok(run.records)).items()):
                ttft_first = stats.values(first, "ttft_s")
                ttft_again = stats.values(again, "ttft_s")
                rows.append(
                    (
                        run.label,
                        rung,
                        tokens,
                        len(first) + len(again),
                        statistics.median(ttft_first) if len(ttft_first) else None,
                        statistics.median(ttft_again) if len(ttft_again) else None,
                    )
                )
        # the same figures drawn, and each rung said faster or not (not: flagged), folded
        curves = tuple(
            Line(name, tuple(float(r[2]) for r in rows), tuple(r[k] for r in rows), style=i)
            for i, (name, k) in enumerate((("first send", 4), ("repeats", 5)))
        )
        faster = tuple(
            (r[0], r[1], "yes" if r[4] is not None and r[5] is not None and r[5] < r[4] else Flag("no")) for r in rows
        )
        return [
            Section(
                "Ladder: TTFT by rung",
                "Each rung's prompt sent once with nothing cached, then again finding its KV: the median TTFT of each.",
                ("run", "rung", "prompt tokens", "requests", "first send TTFT (s)", "repeats' TTFT (s)"),
                tuple(rows),
                parts=(
                    Heading("Repeats against first sends"),
                    Paragraph("A repeat finds its rung's KV: it should be the faster.", "read"),
                    Lines("Median TTFT by rung.", "prompt tokens", "TTFT (s)", curves),
                    document.Table(("run", "rung", "repeat faster"), faster, folded="Faster on a repeat, by rung"),
                ),
            )
        ]


DRIVER = Ladder()
FIGURES = LadderFigures()
