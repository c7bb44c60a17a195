"""The runtime part of a workload kind, its `Driver` (k6's executor, built from the config that
config/kinds/ reads): how it plans and drives an arm, how an arm is run at its loads, and what a
lost worker's share of its schedule was. Every method but `plan` and `drive` has a default that
fits a kind sending requests at one load. `driver(name)` finds a kind's driver by its spec."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from rich.console import Console

from harness.config import kinds
from harness.config.kinds import WorkloadConfig
from harness.workloads.base import Load, Plan, Schedule, Sender

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

C = TypeVar("C", bound=WorkloadConfig)


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


class Taken(Protocol):
    """What a distributed run saw come back of a worker's schedule items."""

    @property
    def indexes(self) -> Collection[int]: ...

    @property
    def turns(self) -> Mapping[int, int]: ...


class Driver(ABC, Generic[C]):
    config: ClassVar[type[WorkloadConfig]]  # the config its spec reads

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
            raise TypeError(f"{w.kind}: a {type(w).__name__} is not this driver's config ({self.config.__name__})")
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


def driver(name: str) -> Driver[Any]:
    """The driver of the kind named `name` (its spec's `driver`)."""
    found = kinds.part(kinds.get(name), "driver")
    if not isinstance(found, Driver):
        raise TypeError(f"workload kind {name!r}: its driver is a {type(found).__name__}, not a Driver")
    return found
