"""`kind = "sessions"`'s spec: its `[workload]` keys (users, turns, think times, the history's
parts, how sessions start); workloads/sessions.py holds the conversations."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Self

import numpy as np

from harness.config.kinds import KindSpec, WorkloadConfig, schedule
from harness.config.kinds.draws import Distribution, Seconds, distribution, draw_length, draw_seconds, longest, seconds
from harness.config.tables import Table

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

HISTORIES = ("synthetic", "real")  # what goes into the history as the answers


@dataclass(frozen=True, kw_only=True)
class SessionsConfig(WorkloadConfig):
    kind: str = "sessions"
    users: int
    turns: Distribution
    think_s: Seconds
    message_tokens: Distribution  # the user's message per turn
    answer_tokens: int  # the answer kvbench writes into the history (and asks for)
    system_prompt_tokens: int = 0  # shared by every user
    user_context_tokens: int = 0  # each user's own document, sent with every turn
    history: Literal["synthetic", "real"] = "synthetic"  # "real": the server's own answers go into it
    start_rate: float | None = None  # new sessions per second (None: all at once)
    max_active: int | None = None  # sessions in flight at most
    seed: int | None = None  # the sessions' shapes' seed (default: prompts.seed)

    @classmethod
    def parse(cls, t: Table) -> Self:
        tokens = "an integer number of tokens"
        return cls(
            users=t.integer("users", required=True, minimum=1, what="an integer number of users"),
            turns=distribution(t, "turns", "turns"),
            think_s=seconds(t, "think_s"),
            system_prompt_tokens=t.integer("system_prompt_tokens", 0, minimum=0, what=tokens),
            user_context_tokens=t.integer("user_context_tokens", 0, minimum=0, what=tokens),
            message_tokens=distribution(t, "message_tokens"),
            answer_tokens=t.integer("answer_tokens", required=True, minimum=1, what=tokens),
            history=t.text("history", cls.history, HISTORIES),
            start_rate=t.number("start_rate", 0.0, positive=True) or None,
            max_active=t.integer("max_active", None, minimum=1, what="an integer number of sessions"),
            seed=t.integer("seed", None, minimum=0),
        )

    def connections(self) -> int:
        return self.max_active or self.users  # sessions in flight at most: one turn each

    def seed_of(self, sc: Scenario) -> int:
        """The sessions' shapes' seed: the kind's own, else the scenario's prompts'."""
        return sc.prompts.seed if self.seed is None else self.seed

    def shape(self, seed: int) -> list[tuple[list[int], list[float]]]:
        """Per user: message tokens per turn, think times between turns (pure, seeded; the run
        and `kvbench size` of the scenario draw the same)."""
        out = []
        for u in range(self.users):
            rng = random.Random(f"{seed}/session/{u}")
            n = max(1, draw_length(self.turns, rng))
            out.append(
                (
                    [draw_length(self.message_tokens, rng) for _ in range(n)],
                    [draw_seconds(self.think_s, rng) for _ in range(n - 1)],
                )
            )
        return out

    def starts(self, seed: int) -> list[float]:
        """When each user's session starts (s after the arm's start): at once, or Poisson at
        `start_rate`."""
        if self.start_rate is None:
            return [0.0] * self.users
        g = schedule.gaps("poisson", self.start_rate, self.users, 1.0, np.random.default_rng([seed, 7]))
        return [0.0, *np.cumsum(g[:-1]).tolist()]

    def longest_prompts(self, out: int) -> list[tuple[str, int, str]]:
        """The last turn resends everything before it."""
        per_turn = longest(self.message_tokens) + self.answer_tokens
        n = self.system_prompt_tokens + self.user_context_tokens + longest(self.turns) * per_turn
        how = " (the last turn: system_prompt_tokens + user_context_tokens + turns x (message_tokens + answer_tokens))"
        return [("workload.turns", n, how)]


SPEC = KindSpec(
    name="sessions",
    config=SessionsConfig,
    figures="harness.analysis.kinds.sessions:FIGURES",
    driver="harness.workloads.sessions:DRIVER",
    batch_limit=1,  # a session is long, and stays where it went
    report_sections=("versus_recompute",),
)
