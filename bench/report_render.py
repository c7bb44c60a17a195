"""How long `kvbench report` takes, and how big the file gets, for a closed-loop run of N
requests (synthetic records, the shape a real run writes).

    python bench/report_render.py [N ...]      # default: 1000 100000
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import ROOT

from harness.report.build import render
from harness.results import load_runs


def fake_run(folder: Path, n: int, concurrency: int = 28) -> None:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    meta = json.loads((ROOT / "bench" / "run-template.json").read_text())
    meta["scenario"]["workload"].update({"requests": n, "concurrency": concurrency})
    (folder / "run.json").write_text(json.dumps(meta))
    free = np.zeros(concurrency)
    with (folder / "requests.jsonl").open("w") as f:
        for i in range(n):
            w = int(np.argmin(free))
            start = float(free[w])
            ttft = float(rng.lognormal(-1.0, 0.5))
            e2e = ttft + float(rng.uniform(3, 6))
            free[w] = start + e2e
            itl = [round(float(x), 6) for x in rng.normal(0.02, 0.002, 8)]
            f.write(
                json.dumps(
                    {
                        "id": i + 1,
                        "arm": "cached",
                        "phase": "run",
                        "prompt_id": f"p{i % 100:05d}",
                        "target_tokens": 45800,
                        "prompt_tokens": 45800,
                        "cached_tokens": 45184,
                        "completion_tokens": 240,
                        "start_s": start,
                        "ttft_s": ttft,
                        "first_byte_s": 0.001,
                        "first_content_s": ttft + 0.3,
                        "headers_s": 0.001,
                        "e2e_s": e2e,
                        "itl_s": itl,
                        "ok": True,
                        "error": None,
                        "error_kind": None,
                        "http_status": 200,
                        "worker": w,
                        "schedule_index": i,
                    }
                )
                + "\n"
            )


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 100_000]
    print("requests  render_s  html_MB")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "s" / "run"
            fake_run(folder, n)
            t = time.perf_counter()
            out = render(load_runs([folder]), Path(tmp) / "r.html")
            dt = time.perf_counter() - t
            print(f"{n:8d}  {dt:8.2f}  {out.stat().st_size / 1e6:7.2f}")


if __name__ == "__main__":
    main()
