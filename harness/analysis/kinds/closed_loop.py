"""`kind = "closed_loop"`'s figures: its throughput is what competing traffic is judged by; and
its plan in tokens, for `kvbench size`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.analysis.kinds import Demand, Figures, pool_demand
from harness.config.kinds.closed_loop import ClosedLoopConfig

if TYPE_CHECKING:
    from harness.config.scenario import Scenario


class ClosedLoopFigures(Figures):
    def traffic_req_per_s(self, s: dict[str, Any]) -> float | None:
        return s.get("req_per_s")

    def demand(self, sc: Scenario) -> Demand:
        """The schedule's requests, each sent as soon as one of `concurrency` connections is free."""
        w = sc.workload
        assert isinstance(w, ClosedLoopConfig)
        return pool_demand(sc, w, w.schedule_picks(sc.prompts.seed), (0.0,) * w.requests, w.concurrency)


FIGURES = ClosedLoopFigures()
