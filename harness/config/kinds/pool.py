"""The prompt pool closed and open loops draw from: its `[workload]` keys (`PoolConfig`)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from harness.config.kinds import WorkloadConfig
from harness.config.kinds.draws import Distribution, distribution, draw_length, longest, smallest
from harness.config.tables import Table


@dataclass(frozen=True, kw_only=True)
class PoolConfig(WorkloadConfig):
    """The prompt pool of closed and open loops: `pool` prompts of `prompt_tokens` (drawn per
    prompt), the first `shared_prefix_tokens` of each shared by all."""

    pool: int
    prompt_tokens: Distribution
    shared_prefix_tokens: int = 0

    @classmethod
    def pool_keys(cls, t: Table) -> dict[str, Any]:
        pool = dict(
            pool=t.integer("pool", required=True, minimum=1, what="an integer number of distinct prompts"),
            prompt_tokens=distribution(t, "prompt_tokens"),
            shared_prefix_tokens=t.integer(
                "shared_prefix_tokens", cls.shared_prefix_tokens, minimum=0, what="an integer number of tokens"
            ),
        )
        least = smallest(pool["prompt_tokens"])
        if pool["shared_prefix_tokens"] and pool["shared_prefix_tokens"] >= least:
            t.fail(
                "shared_prefix_tokens",
                f"expected fewer tokens than the shortest prompt ({least})",
                pool["shared_prefix_tokens"],
            )
        return pool

    def shared_prefix(self) -> int:
        return self.shared_prefix_tokens

    def lengths(self, seed: int) -> list[int]:
        """The synthetic pool's prompt lengths, drawn (seeded: the run and `kvbench size` of the
        scenario draw the same)."""
        rng = random.Random(f"{seed}/pool-lengths")
        return [draw_length(self.prompt_tokens, rng) for _ in range(self.pool)]

    def picks(self, stream: str, n: int) -> tuple[int, ...]:
        """The pool's prompt for each of n requests, drawn from the seeded stream named `stream`."""
        rng = random.Random(stream)
        return tuple(rng.randrange(self.pool) for _ in range(n))

    def longest_prompts(self, out: int) -> list[tuple[str, int, str]]:
        return [("workload.prompt_tokens", longest(self.prompt_tokens) + out, "")]
