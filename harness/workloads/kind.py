"""The interface every workload kind implements, in one module of its own (k6's executors,
pytest's hook specs): a kind owns its `[workload]` config (a `kinds.WorkloadConfig`), how it plans
and drives an arm, how an arm is run at its loads, how its schedule is shared among client
processes, and the figures, terminal lines, report sections and gate figures it adds. Every
method but `plan` and `drive` has a default that fits a kind sending requests at one load."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from rich.console import Console
from rich.markup import escape

from harness.analysis import stats
from harness.config.kinds import WorkloadConfig
from harness.monitor import progress
from harness.results import RequestRecord, RunResult
from harness.workloads.base import Load, Plan, Schedule, Sender

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

C = TypeVar("C", bound=WorkloadConfig)
GateFigures = dict[tuple[str, int | None], float]  # (figure, prompt length or None) -> value


class Measured(Protocol):
    """What the runner tells a kind of one result folder it measured."""

    @property
    def ends_run(self) -> bool: ...

    @property
    def summary(self) -> dict[str, Any]: ...

    @property
    def folder(self) -> Path: ...


# Measures the arm at one load, into a folder of its own ("at": the folder's suffix, or None).
MeasureLoad = Callable[[Load | None, str | None], Awaitable[Measured]]


@dataclass(frozen=True)
class ArmsDone:
    """Every arm of a run measured: where their folders are, for a kind's figures across arms."""

    scenario: Scenario
    folders: tuple[Path, ...]
    results: Path  # the scenario's results folder
    run_id: str
    console: Console


@dataclass(frozen=True)
class Section:
    """A report section a kind adds: a title, a sentence saying what it shows, and a table
    (every cell text or a number; the report escapes them)."""

    title: str
    text: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


class Taken(Protocol):
    """What a distributed run saw come back of a worker's schedule items."""

    @property
    def indexes(self) -> Collection[int]: ...

    @property
    def turns(self) -> Mapping[int, int]: ...


class WorkloadKind(ABC, Generic[C]):
    name: ClassVar[str]
    config: ClassVar[type[WorkloadConfig]]
    # may several client processes or hosts share its schedule (--workers, --ray)
    shares_schedule: ClassVar[bool] = True
    # schedule items one worker takes at most at a time (None: as many as its pace asks for)
    batch_limit: ClassVar[int | None] = None
    # figures per prompt length (cold against warm) rather than a throughput
    per_length: ClassVar[bool] = False
    # the report's own sections its runs go into (report/sections.py SECTIONS)
    report_sections: ClassVar[tuple[str, ...]] = ()
    # per-run figures its `gate_figures` adds to the gate's own (gate/rules.py PER_RUN)
    gate_metrics: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    async def plan(self, sender: Sender, prior: Plan | None = None) -> Plan:
        """Prompts and schedule, settled before the arm's clock starts (`prior`: a plan of the
        same arm at another load, whose prompts it may reuse)."""

    @abstractmethod
    async def drive(
        self, sender: Sender, plan: Plan, take: Schedule | None = None, connections: int | None = None, first: int = 0
    ) -> None:
        """Sends the requests through `sender.send`; `take`: where schedule items come from
        (default: the plan's schedule; a process of several gets one shared by all), on
        `connections` (default: the arm's) numbered from `first`."""

    def cfg(self, sc: Scenario) -> C:
        """The scenario's workload config, as this kind's own type."""
        w = sc.workload
        if not isinstance(w, self.config):
            raise TypeError(f"{self.name}: a {type(w).__name__} is not this kind's config")
        return cast(C, w)

    # -- an arm and its loads -------------------------------------------------------------

    async def run_arm(self, sc: Scenario, measure: MeasureLoad, console: Console, arm: str) -> None:
        """Measures the arm: at its one load, by default."""
        await measure(None, None)

    def after_arms(self, done: ArmsDone) -> None:
        """Figures across the arms' folders, once every arm is measured."""

    # -- sharing the schedule among processes -----------------------------------------------

    def untaken(self, plan: Plan, index: int, prompt: int, seen: Taken) -> list[tuple[int, dict[str, Any]]]:
        """Of schedule item (index, prompt) a lost worker took: the prompt index and record fields
        of each request of it that it did not report (none: it reported all of it)."""
        return [] if index in seen.indexes else [(prompt, {"schedule_index": index})]

    # -- figures ---------------------------------------------------------------------------

    def summary(self, records: stats.Records, slo: dict[str, float] | None = None) -> dict[str, Any]:
        """run.json's summary of one arm (or one load): `stats.summary`'s figures, the throughput,
        the kind's own (`figures`), and the schedule lag where requests had send times."""
        out = stats.summary(records)
        counted = stats.measured(records)
        out.update(stats.rates(counted))
        out.update(self.figures(records, counted, slo))
        if "schedule_lag" not in out and any(r.intended_s is not None for r in counted):
            out["schedule_lag"] = stats.schedule_lag(counted)
        return out

    def figures(
        self, records: stats.Records, counted: list[RequestRecord], slo: dict[str, float] | None
    ) -> dict[str, Any]:
        """The kind's own summary figures, over the measured records (`counted`) of all."""
        return {}

    def show(self, console: Console, heading: str, s: dict[str, Any], unit: str) -> None:
        """An arm's summary in the terminal."""
        ttft = s["ttft_s"]
        fmt = progress.fmt
        console.print(
            f"[bold]{escape(heading)}[/]: {s['completed']}/{s['requests']} completed, "
            f"{fmt(s['req_per_s'], 3)} req/s, TTFT p50 {fmt(ttft['p50'])} s, p99 {fmt(ttft['p99'])} s, "
            f"duration {fmt(s['duration_s'], 2)} s{unit}"
        )
        if s.get("ttft_includes_restore"):
            console.print(f"  {stats.RESTORE_NOTE}", markup=False)
        for line in self.lines(s):
            console.print(f"  {line}", markup=False)

    def lines(self, s: dict[str, Any]) -> list[str]:
        """The terminal's lines under an arm's headline."""
        lag = s.get("schedule_lag")
        return [progress.sent(lag)] if lag and lag["requests"] else []

    def traffic_req_per_s(self, s: dict[str, Any]) -> float | None:
        """The throughput competing traffic is judged by (the Redbooks' third test), if any."""
        return None

    def gate_figures(self, run: RunResult) -> GateFigures:
        """The figures a run gives once, for the gate: its throughput."""
        t = stats.throughput(stats.measured(run.records))
        return {
            (name, None): v
            for name, v in (
                ("req_per_s", t.req_per_s),
                ("steady_req_per_s", t.steady_req_per_s),
                ("output_tokens_per_s", t.output_tokens_per_s),
            )
            if v is not None
        }

    def sections(self, runs: list[RunResult]) -> list[Section]:
        """Report sections of the kind's own, over its runs (those with records)."""
        return []


class ReusesAcrossRequests(WorkloadKind[C]):
    """A kind whose requests reuse each other's prefixes as they come (a trace, sessions): its
    summary says what share of the prompt tokens the server served from cache, and the terminal
    says it beside what an infinite cache could have."""

    def figures(
        self, records: stats.Records, counted: list[RequestRecord], slo: dict[str, float] | None
    ) -> dict[str, Any]:
        return {"cached_share": stats.cached_share(counted)}

    def lines(self, s: dict[str, Any]) -> list[str]:
        return [*progress.cached_lines(s), *super().lines(s)]
