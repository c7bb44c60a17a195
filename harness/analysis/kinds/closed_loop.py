"""`kind = "closed_loop"`'s figures: its throughput is what competing traffic is judged by."""

from __future__ import annotations

from typing import Any

from harness.analysis.kinds import Figures


class ClosedLoopFigures(Figures):
    def traffic_req_per_s(self, s: dict[str, Any]) -> float | None:
        return s.get("req_per_s")


FIGURES = ClosedLoopFigures()
