"""`kind = "sessions"`'s figures: those of a kind whose requests reuse each other's prefixes, what a
turn's prompt shares with the others', and its report section: TTFT and the cached share against
the turn, the idle time before it and its context."""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING

import numpy as np

from harness.analysis import stats
from harness.analysis.kinds import Demand, Parts, ReusesAcrossRequests, workload_tokens
from harness.analysis.kinds.document import Scatter, Section, Series
from harness.config.kinds.sessions import SessionsConfig
from harness.results import RequestRecord, RunResult, Table

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

# Idle-time buckets of the report (seconds between a session's turns, model time).
IDLE_BUCKETS_S = (0.0, 1.0, 5.0, 15.0, 60.0, 300.0, math.inf)
# A plot draws at most about this many turns of a run (every k-th beyond it, and says so)
PLOT_POINTS = 20_000
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

    def demand(self, sc: Scenario) -> Demand:
        """The scenario's sessions as the run draws them (`SessionsConfig.shape`, `starts`): a group
        per session, each turn's prompt the system prompt, then the session's own context and
        history (every message before it with its answer, `answer_tokens` each, and its own
        message), asking for `answer_tokens`; a turn is sent its think time after the one before
        it ended; `max_active` sessions at a time. The chat template's and the lead's tokens the
        prompt builder adds are not counted (a few per prompt)."""
        w = sc.workload
        assert isinstance(w, SessionsConfig)
        seed = w.seed_of(sc)
        parts: list[Parts] = []
        ready: list[float] = []
        first: list[bool] = []
        for u, ((messages, waits), start) in enumerate(zip(w.shape(seed), w.starts(seed), strict=True)):
            own = w.user_context_tokens
            for k, m in enumerate(messages):
                own += m
                parts.append((("shared", w.system_prompt_tokens), (f"session {u}", own)))
                ready.append(start if k == 0 else waits[k - 1])
                first.append(k == 0)
                own += w.answer_tokens
        return Demand(tuple(parts), (w.answer_tokens,) * len(parts), tuple(ready), tuple(first), w.max_active)

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
    t = Table.of(records)
    turns = stats.groups(t.where(~np.isnan(t.numbers("turn"))), ("turn",))
    return tuple(_row(str(n), g) for (n,), g in turns.items())


def by_idle(records: stats.Records) -> tuple[tuple[object, ...], ...]:
    """TTFT and the cached share per bucket of idle time before the turn (first turns, which
    follow no idle time, apart)."""
    t = Table.of(records)
    idle = t.numbers("idle_s")
    rows = [_row("first turn", t.where(t.numbers("turn") == 1))]
    for lo, hi in itertools.pairwise(IDLE_BUCKETS_S):
        inside = t.where((idle >= lo) & (idle < hi))  # False where there is none (NaN)
        rows.append(_row(f"{lo:g}-{hi:g} s" if math.isfinite(hi) else f">= {lo:g} s", inside))
    return tuple(r for r in rows if r[1])


def _row(label: str, records: Table) -> tuple[object, ...]:
    ttft = stats.values(records, "ttft_s")
    share = stats.cached_share(records)
    shown = "-" if share is None else f"{share * 100:.1f} %"
    return (label, len(records), stats.percentile(ttft, 50), stats.percentile(ttft, 99), shown)


def _column(t: Table, name: str) -> np.ndarray:
    return stats.context_tokens(t) if name == "context_tokens" else t.numbers(name)


def _points(runs: list[RunResult], x: str, y: str) -> tuple[Series, ...]:
    out = []
    for run in runs:
        done = stats.ok(run.records)
        xs, ys = _column(done, x), _column(done, y)
        both = ~np.isnan(xs) & ~np.isnan(ys)
        out.append(_series(run.label, xs[both], ys[both]))
    return tuple(out)


def _shares(run: RunResult) -> Series:
    done = stats.ok(run.records)
    idle, prompt = done.numbers("idle_s"), np.nan_to_num(done.numbers("prompt_tokens"))
    told = ~np.isnan(idle) & (prompt != 0)
    y = np.nan_to_num(done.numbers("cached_tokens")[told]) / prompt[told]
    return _series(run.label, idle[told], y)


def _series(label: str, x: np.ndarray, y: np.ndarray) -> Series:
    """A run's points, every k-th of them beyond PLOT_POINTS (its label then says "1 in k")."""
    every = -(-len(x) // PLOT_POINTS)
    if every > 1:
        label, x, y = f"{label} (1 in {every})", x[::every], y[::every]
    return Series(label, tuple(x.tolist()), tuple(y.tolist()))


FIGURES = SessionsFigures()
