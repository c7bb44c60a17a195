"""The client's ceiling: how many streamed requests per second (256 output tokens each) one
kvbench process sustains at 28 and 256 connections, on one core, against bench/firehose.py on
the other (TTFT 0). Medians of 3 runs, with the spread. With a workers count, kvbench runs with
--workers N on every core but the server's (needs more than 2 cores to show anything).

    python bench/ceiling.py [requests] [workers]      # defaults 4000, 1
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import STREAMING, Firehose, kvbench_run


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    print("connections  req/s (median, min-max of 3)   tok/s (median)  client CPU  loop lag p99 ms")
    for conc in (28, 256):
        rps, tps, cpu, lag = [], [], [], []
        for _ in range(3):
            with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=256) as fh:
                (folder,) = kvbench_run(
                    STREAMING.format(name="ceiling", requests=n, concurrency=conc),
                    fh.base_url,
                    Path(tmp),
                    ["--workers", str(workers)] if workers > 1 else None,
                )
                meta = json.loads((folder / "run.json").read_text())
                rps.append(meta["summary"]["req_per_s"])
                tps.append(meta["summary"]["output_tokens_per_s"])
                cpu.append(meta["client_health"]["cpu_share_of_one_core"]["mean"] or 0)
                lag.append(meta["client_health"]["loop_lag_ms"]["p99"] or 0)
        print(
            f"{conc:11d}  {statistics.median(rps):7.0f} ({min(rps):.0f}-{max(rps):.0f})"
            f"{statistics.median(tps):22.0f}  {statistics.median(cpu):9.0%}  {statistics.median(lag):8.2f}"
        )


if __name__ == "__main__":
    main()
