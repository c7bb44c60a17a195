"""The client's ceiling: how many streamed requests per second (256 output tokens each) kvbench
sustains against bench/firehose.py (TTFT 0, pinned to core 1). Medians of 3 runs, with the
spread.

Rows: one process on core 0 at 28 and 256 connections; then `--workers N` (default: one per
core) with 28 connections per worker, on every core but the server's, or on all cores where
there are not enough spare ones. Scaling is the workers' rate over the one process's, and
efficiency is that over the cores the client really had: on a 2-core machine the second worker
shares core 1 with the server, whose CPU use is measured during the run and subtracted.

    python bench/ceiling.py [requests] [workers]      # defaults 4000, number of cores
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import SERVER_CORE, STREAMING, Firehose, client_cores, kvbench_run


def runs(n: int, conc: int, workers: int) -> dict[str, list[float]]:
    """Three runs: req/s, tok/s, client CPU, loop lag p99, and the server's share of its core."""
    out: dict[str, list[float]] = {"rps": [], "tps": [], "cpu": [], "lag": [], "server": []}
    for _ in range(3):
        with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=256) as fh:
            before = fh.cpu_s()
            (folder,) = kvbench_run(
                STREAMING.format(name="ceiling", requests=n, concurrency=conc),
                fh.base_url,
                Path(tmp),
                ["--workers", str(workers)] if workers > 1 else None,
                cores=client_cores(workers),
            )
            meta = json.loads((folder / "run.json").read_text())
            out["server"].append((fh.cpu_s() - before) / meta["summary"]["duration_s"])
        out["rps"].append(meta["summary"]["req_per_s"])
        out["tps"].append(meta["summary"]["output_tokens_per_s"])
        out["cpu"].append(meta["client_health"]["cpu_share_of_one_core"]["mean"] or 0)
        out["lag"].append(meta["client_health"]["loop_lag_ms"]["p99"] or 0)
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1
    med = statistics.median
    print("processes  connections  req/s (median, min-max of 3)  tok/s (median)  client CPU  loop lag p99 ms")
    rows = [(1, 28), (1, 256)] + ([(workers, 28 * workers)] if workers > 1 else [])
    one = 0.0
    for w, conc in rows:
        r = runs(n, conc, w)
        print(
            f"{w:9d}  {conc:11d}  {med(r['rps']):7.0f} ({min(r['rps']):.0f}-{max(r['rps']):.0f})"
            f"{med(r['tps']):24.0f}  {med(r['cpu']):9.0%}  {med(r['lag']):8.2f}"
        )
        if w == 1 and conc == 28:
            one = med(r["rps"])
        if w > 1:
            cores = client_cores(w)
            shared = med(r["server"]) if SERVER_CORE in cores else 0.0
            available = len(cores) - shared
            scaling = med(r["rps"]) / one
            print(
                f"  {w} workers on cores {sorted(cores)}: {scaling:.2f}x one process; the server used {shared:.0%}"
                f" of core {SERVER_CORE}, so the client had {available:.2f} cores: efficiency {scaling / available:.0%}"
            )


if __name__ == "__main__":
    main()
