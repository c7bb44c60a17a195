"""`kind = "trace"`'s figures: those of a kind whose requests reuse each other's prefixes; what its
prompts share is its trace's to say."""

from __future__ import annotations

from harness.analysis.kinds import Parts, ReusesAcrossRequests
from harness.core.errors import InputError
from harness.results import RequestRecord, RunResult


class TraceFigures(ReusesAcrossRequests):
    def prompt_parts(self, run: RunResult, record: RequestRecord) -> Parts:
        """The trace's block ids say what a replayed request shares: size the trace itself."""
        path = (run.scenario.get("workload") or {}).get("path")
        raise InputError(
            f"{run.folder}: a trace replay: its requests share what its trace's block ids say; size the "
            f"trace itself ([workload] trace = {str(path)!r}, rate_scale for the replay's speed)"
        )


FIGURES = TraceFigures()
