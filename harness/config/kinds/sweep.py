"""`kind = "sweep"`'s spec: its `[workload]` keys (`lengths`, `warm_repeats`, `repetitions`);
workloads/sweep.py sends it, analysis/kinds/sweep.py gives its figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from harness.config.kinds import KindSpec, WorkloadConfig
from harness.config.tables import Table
from harness.core.errors import InputError

if TYPE_CHECKING:
    from harness.config.scenario import Scenario


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


SPEC = KindSpec(
    name="sweep",
    config=SweepConfig,
    figures="harness.analysis.kinds.sweep:FIGURES",
    driver="harness.workloads.sweep:DRIVER",
    shares_schedule=False,  # each warm request follows its cold one: one connection
    per_length=True,
)
