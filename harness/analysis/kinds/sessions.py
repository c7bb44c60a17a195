"""`kind = "sessions"`'s figures: those of a kind whose requests reuse each other's prefixes, what a
turn's prompt shares with the others', and its report section: TTFT and the cached share against
the turn, the idle time before it and its context."""

from __future__ import annotations

import itertools
import math

from harness.analysis import stats
from harness.analysis.kinds import Parts, ReusesAcrossRequests, Scatter, Section, Series, workload_tokens
from harness.results import RequestRecord, RunResult

# Idle-time buckets of the report (seconds between a session's turns, model time).
IDLE_BUCKETS_S = (0.0, 1.0, 5.0, 15.0, 60.0, 300.0, math.inf)
COLUMNS = ("requests", "TTFT p50 (s)", "TTFT p99 (s)", "cached share")
READ = (
    "How to read this: every turn resends the session's whole history, so all but its newest message could "
    "come from cache. Idle time is how long the session waited (the user thinking) before the turn. On a "
    "stack with KV tiers the points step up with idle time: still on the GPU, then loaded from host memory "
    "or storage, then recomputed once evicted everywhere. Cached share = prompt tokens the server reported "
    "cached / prompt tokens."
)


class SessionsFigures(ReusesAcrossRequests):
    def prompt_parts(self, run: RunResult, record: RequestRecord) -> Parts:
        """The system prompt (every session's), then the session's own context and history: each
        turn resends the turns before it with their answers, so a turn's prompt begins with the
        last one's and its answer (workloads/sessions.py)."""
        n = record.context_tokens or 0
        system = min(workload_tokens(run, "system_prompt_tokens"), n)
        return (("shared", system), (f"session {record.session}", n - system))

    def sections(self, runs: list[RunResult]) -> list[Section]:
        """TTFT against the idle time before each turn and against its context (where a tiered
        stack shows its steps), the cached share against idle time; per run, the figures per turn
        and per idle-time bucket."""
        plots = (
            Scatter(
                "TTFT against the idle time before each turn.",
                "idle time before the turn (s)",
                "TTFT (s)",
                _points(runs, "idle_s", "ttft_s"),
                logy=True,
            ),
            Scatter(
                "Cached share of each turn's prompt against the idle time before it.",
                "idle time before the turn (s)",
                "cached share of the prompt",
                tuple(_shares(run) for run in runs),
            ),
            Scatter(
                "TTFT against the turn's context (prompt tokens).",
                "context (prompt tokens)",
                "TTFT (s)",
                _points(runs, "context_tokens", "ttft_s"),
                logy=True,
            ),
        )
        out = [Section("Multi-turn sessions: what comes back after a pause", READ, plots=plots)]
        for run in runs:
            out.append(
                Section(
                    f"{run.label}: by turn",
                    "TTFT and the cached share of the prompt tokens per turn.",
                    ("turn", *COLUMNS),
                    by_turn(run.records),
                )
            )
            out.append(
                Section(
                    f"{run.label}: by idle time",
                    "TTFT and the cached share per bucket of idle time before the turn (first turns apart: no "
                    "idle time before them).",
                    ("idle time before the turn", *COLUMNS),
                    by_idle(run.records),
                )
            )
        return out


def by_turn(records: stats.Records) -> tuple[tuple[object, ...], ...]:
    """TTFT and the cached share of prompt tokens per turn."""
    turns = stats.groups([r for r in records if r.turn is not None], ("turn",))
    return tuple(_row(str(t), g) for (t,), g in turns.items())


def by_idle(records: stats.Records) -> tuple[tuple[object, ...], ...]:
    """TTFT and the cached share per bucket of idle time before the turn (first turns, which
    follow no idle time, apart)."""
    rows = [_row("first turn", [r for r in records if r.turn == 1])]
    for lo, hi in itertools.pairwise(IDLE_BUCKETS_S):
        inside = [r for r in records if r.idle_s is not None and lo <= r.idle_s < hi]
        rows.append(_row(f"{lo:g}-{hi:g} s" if math.isfinite(hi) else f">= {lo:g} s", inside))
    return tuple(r for r in rows if r[1])


def _row(label: str, records: stats.Records) -> tuple[object, ...]:
    ttft = stats.values(records, "ttft_s")
    share = stats.cached_share(records)
    shown = "-" if share is None else f"{share * 100:.1f} %"
    return (label, len(records), stats.percentile(ttft, 50), stats.percentile(ttft, 99), shown)


def _points(runs: list[RunResult], x: str, y: str) -> tuple[Series, ...]:
    out = []
    for run in runs:
        ok = [q for q in run.records if q.ok and getattr(q, x) is not None and getattr(q, y) is not None]
        out.append(Series(run.label, tuple(getattr(q, x) for q in ok), tuple(getattr(q, y) for q in ok)))
    return tuple(out)


def _shares(run: RunResult) -> Series:
    ok = [q for q in run.records if q.ok and q.idle_s is not None and q.prompt_tokens]
    y = tuple((q.cached_tokens or 0) / (q.prompt_tokens or 1) for q in ok)
    return Series(run.label, tuple(q.idle_s or 0.0 for q in ok), y)


FIGURES = SessionsFigures()
