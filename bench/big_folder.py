"""A large result folder for memory benchmarks of the readers (issue 56 item 10): the shipped
golden closed loop's two arms, each with N records drawn like its own (ids, start times and
TTFTs spread, 7 gaps a request as in the original), written line by line.

    python bench/big_folder.py N OUT      # OUT/golden-loop/<run>-{recompute,cached}/

Then e.g. `/usr/bin/time -v kvbench report OUT/golden-loop` for the peak RSS.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import orjson
from common import ROOT

GOLDEN = ROOT / "tests" / "golden" / "runs" / "golden-loop"


def write(n: int, out: Path) -> Path:
    scenario = out / "golden-loop"
    rng = np.random.default_rng(0)
    for arm in sorted(GOLDEN.iterdir()):
        folder = scenario / arm.name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(arm / "run.json", folder / "run.json")
        shutil.copy(arm / "metrics.json", folder / "metrics.json")
        lines = [orjson.loads(line) for line in (arm / "requests.jsonl").read_bytes().splitlines()]
        with (folder / "requests.jsonl").open("wb") as f:
            for start in range(0, n, 100_000):
                k = min(100_000, n - start)
                picks = rng.integers(0, len(lines), k).tolist()
                jitter = rng.uniform(0.5, 1.5, k).tolist()
                buf = bytearray()
                for j in range(k):
                    d = dict(lines[picks[j]])
                    i = start + j
                    d["id"], d["schedule_index"] = i + 1, i
                    d["start_s"] = round(i * 0.01, 7)
                    if d["ttft_s"] is not None:
                        d["ttft_s"] = round(d["ttft_s"] * jitter[j], 7)
                        d["e2e_s"] = round(d["e2e_s"] * jitter[j], 7)
                    buf += orjson.dumps(d) + b"\n"
                f.write(buf)
    return scenario


if __name__ == "__main__":
    print(write(int(sys.argv[1]), Path(sys.argv[2])))
