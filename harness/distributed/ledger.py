"""What a distributed arm's coordinator knows of its schedule, and the rule every arm ends by:
records + lost + unsent = scheduled. Plain Python with no transport or clock, so that the rule can
be tested under any interleaving of takes, answers, losses and stops (tests/test_distributed.py).

- A record a worker shipped counts once (`recorded`); what a lost worker took and did not report
  is lost, each request of it once (`lose`: a session's turns not yet sent included).
- `unsent`: what nobody sent because the run was told to stop (or stopped itself) first.
- Anything else left over is an imbalance: some requests were neither sent nor counted lost. The
  arm then says so as an error, never as completed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.distributed.messages import Item
from harness.workloads.base import Plan
from harness.workloads.kind import driver


@dataclass
class Taken:
    """What came back of an arm's schedule items (workloads/kind.py's `Taken`)."""

    indexes: set[int] = field(default_factory=set)  # schedule indexes
    turns: dict[int, int] = field(default_factory=dict)  # session -> turns reported


@dataclass(frozen=True)
class Accounting:
    """run.json's `distributed.accounting` for one arm."""

    scheduled: int
    recorded: int
    lost: int
    unsent: int

    @property
    def balanced(self) -> bool:
        return self.recorded + self.lost + self.unsent == self.scheduled

    def meta(self) -> dict[str, Any]:
        return {**vars(self), "balanced": self.balanced}

    def problem(self) -> str | None:
        """The error an imbalance is, in a sentence; None when the arm is balanced."""
        if self.balanced:
            return None
        gap = self.scheduled - self.recorded - self.lost - self.unsent
        what = "were neither sent nor recorded as lost" if gap > 0 else "more were recorded than scheduled"
        return (
            f"{abs(gap)} of {self.scheduled} scheduled request(s): {what} ({self.recorded} recorded, "
            f"{self.lost} lost, {self.unsent} unsent because the run stopped)"
        )


class Ledger:
    """One arm's count of `plan`'s requests as its workers report them and as workers are lost."""

    def __init__(self, kind: str, plan: Plan) -> None:
        self.kind, self.plan = kind, plan
        self.seen = Taken()
        self.recorded = self.lost = 0

    def record(self, index: int | None, session: int | None) -> None:
        """A record came back (of schedule item `index`, or of session `session`'s next turn)."""
        self.recorded += 1
        if session is not None:
            self.seen.turns[session] = self.seen.turns.get(session, 0) + 1
        elif index is not None:
            self.seen.indexes.add(index)

    def lose(self, taken: list[Item]) -> list[tuple[int, int, dict[str, Any]]]:
        """A lost worker's items (what it took): (schedule index, prompt index, record fields) of
        each request of them it did not report, counted lost once."""
        out = []
        kind = driver(self.kind)
        for i, p in taken:
            for prompt, extra in kind.untaken(self.plan, i, p, self.seen):
                out.append((i, prompt, extra))
                if "session" in extra:
                    self.seen.turns[extra["session"]] = extra["turn"]
                else:
                    self.seen.indexes.add(i)
        self.lost += len(out)
        return out

    def close(self, stopped: bool) -> Accounting:
        """The arm's count at its end: what is left is unsent if the run stopped, an imbalance if not."""
        left = self.plan.total - self.recorded - self.lost
        return Accounting(self.plan.total, self.recorded, self.lost, left if stopped and left > 0 else 0)
