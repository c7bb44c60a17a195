"""`kind = "closed_loop"`'s spec: its `[workload]` keys (`requests`, `concurrency`, the pool's);
workloads/closed_loop.py sends it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from harness.config.kinds import KindSpec
from harness.config.kinds.pool import PoolConfig
from harness.config.tables import Table
from harness.core.errors import InputError

if TYPE_CHECKING:
    from harness.config.scenario import Scenario


@dataclass(frozen=True, kw_only=True)
class ClosedLoopConfig(PoolConfig):
    kind: str = "closed_loop"
    requests: int
    concurrency: int

    @classmethod
    def parse(cls, t: Table) -> Self:
        return cls(
            requests=t.integer("requests", required=True, minimum=1, what="an integer number of requests"),
            concurrency=t.integer("concurrency", required=True, minimum=1, what="an integer number of connections"),
            **cls.pool_keys(t),
        )

    def check(self, sc: Scenario) -> None:
        for i, a in enumerate(sc.arms):  # each connection keeps to an engine slot: its file comes back
            if a.warm_from not in ("active", "disk"):
                raise InputError(
                    f'{sc.path}: arms[{i}].warm_from: "{a.warm_from}" applies to kind = "sweep" workloads; '
                    'a closed loop takes "disk"'
                )

    def connections(self) -> int:
        return self.concurrency

    def schedule_picks(self, seed: int) -> tuple[int, ...]:
        """Each request's prompt of the pool, in schedule order."""
        return self.picks(f"{seed}/schedule", self.requests)


SPEC = KindSpec(
    name="closed_loop",
    config=ClosedLoopConfig,
    figures="harness.analysis.kinds.closed_loop:FIGURES",
    driver="harness.workloads.closed_loop:DRIVER",
    report_sections=("versus_recompute",),
)
