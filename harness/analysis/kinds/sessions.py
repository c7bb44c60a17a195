"""`kind = "sessions"`'s figures: those of a kind whose requests reuse each other's prefixes, and
what a turn's prompt shares with the others'."""

from __future__ import annotations

from harness.analysis.kinds import Parts, ReusesAcrossRequests, workload_tokens
from harness.results import RequestRecord, RunResult


class SessionsFigures(ReusesAcrossRequests):
    def prompt_parts(self, run: RunResult, record: RequestRecord) -> Parts:
        """The system prompt (every session's), then the session's own context and history: each
        turn resends the turns before it with their answers, so a turn's prompt begins with the
        last one's and its answer (workloads/sessions.py)."""
        n = record.context_tokens or 0
        system = min(workload_tokens(run, "system_prompt_tokens"), n)
        return (("shared", system), (f"session {record.session}", n - system))


FIGURES = SessionsFigures()
