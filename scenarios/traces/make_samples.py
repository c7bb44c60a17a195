"""Makes the sample traces shipped beside it (seeded: the same files every time; no downloads).

- mooncake-sample.jsonl: 300 requests over ~150 s (Poisson, 2 req/s) in Mooncake's format
  (timestamp in ms, 512-token hash_ids blocks). Each request reads one of 12 shared documents
  (2-12 blocks, a repository or a manual) up to a random depth, then a question of its own.
- bailian-sample.jsonl: 40 conversations of 1-6 turns in Qwen-Bailian's format (timestamp in s,
  16-token blocks); each turn resends the whole history (the parent's blocks) and adds its own,
  after a think time of 5-60 s.

    python scenarios/traces/make_samples.py      # rewrites both files here
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Ids:
    """hash_ids as the public traces remap them: integers in order of first appearance."""

    def __init__(self) -> None:
        self.next = 0

    def new(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def mooncake(rng: random.Random) -> list[dict[str, object]]:
    ids = Ids()
    docs = [ids.new(rng.randint(2, 12)) for _ in range(12)]
    out, t = [], 0.0
    for _ in range(300):
        doc = rng.choice(docs)
        depth = rng.randint(1, len(doc))
        own = rng.randint(1, 3)
        tail = rng.randint(1, 511)  # the last block is partial: never cached
        blocks = doc[:depth] + ids.new(own)
        out.append(
            {
                "timestamp": round(t * 1000),
                "input_length": (len(blocks) - 1) * 512 + tail,
                "output_length": rng.randint(16, 400),
                "hash_ids": blocks,
            }
        )
        t += rng.expovariate(2.0)
    return out


def bailian(rng: random.Random) -> list[dict[str, object]]:
    ids = Ids()
    system = ids.new(8)  # a system prompt every conversation shares
    turns: list[tuple[float, dict[str, object]]] = []
    for chat in range(40):
        start = rng.uniform(0, 300)
        history = list(system)
        parent, t = -1, start
        for turn in range(1, rng.randint(1, 6) + 1):
            history += ids.new(rng.randint(2, 30))
            chat_id = chat * 100 + turn
            request = {
                "chat_id": chat_id,
                "parent_chat_id": parent,
                "timestamp": round(t, 3),
                "input_length": len(history) * 16 - rng.randint(0, 15),
                "output_length": rng.randint(8, 300),
                "type": "text",
                "turn": turn,
                "hash_ids": list(history),
            }
            turns.append((t, request))
            history += ids.new(rng.randint(1, 10))  # the answer joins the history
            parent, t = chat_id, t + rng.uniform(5, 60)
    return [r for _, r in sorted(turns, key=lambda x: x[0])]


def write(name: str, rows: list[dict[str, object]]) -> Path:
    path = HERE / name
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8")
    return path


def main() -> None:
    for path in (
        write("mooncake-sample.jsonl", mooncake(random.Random(1))),
        write("bailian-sample.jsonl", bailian(random.Random(2))),
    ):
        print(path)


if __name__ == "__main__":
    main()
