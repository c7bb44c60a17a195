"""Open-loop schedule keeping: how late kvbench sends against its drawn Poisson schedule, at 100
req/s and at 80 % of the client's closed-loop ceiling, against bench/firehose.py (pinned to core
1; 200 ms to the first token, then 256 tokens at once, ~1,000-token prompts). Lag = the moment
the request's headers were on the socket - its intended send time. Also the Kolmogorov-Smirnov
p-value of the real send gaps against the exponential of the rate. Medians over 3 runs.

    python bench/schedule_lag.py [requests] [workers]   # defaults 3000 per rate, 1 process

With workers > 1 the rates are the same (80 % of one process's ceiling), sent by that many
processes sharing the schedule (on every core, the server's too, as ceiling.py does).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import POISSON, STREAMING, Firehose, client_cores, kvbench_run

from harness.analysis import stats
from harness.results import read_requests


def ceiling() -> float:
    with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=256) as fh:
        (folder,) = kvbench_run(STREAMING.format(name="ceiling", requests=3000, concurrency=28), fh.base_url, Path(tmp))
        return float(json.loads((folder / "run.json").read_text())["summary"]["req_per_s"])


def once(rate: float, n: int, workers: int) -> dict[str, float]:
    extra = ["--workers", str(workers)] if workers > 1 else None
    with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=200, tokens=256) as fh:
        (folder,) = kvbench_run(
            POISSON.format(name="lag", rate=rate, requests=n),
            fh.base_url,
            Path(tmp),
            extra,
            cores=client_cores(workers),
        )
        recs = [r for r in read_requests(folder) if r.phase == "run"]
        meta = json.loads((folder / "run.json").read_text())
    lag = stats.schedule_lag(recs)
    fit = stats.arrival_fit(recs, "poisson", rate, 1.0)
    return {
        "p50": lag["p50_s"] * 1e3,
        "p99": lag["p99_s"] * 1e3,
        "max": lag["max_s"] * 1e3,
        "sent": lag["sent_req_per_s"],
        "ks": fit["ks_p"],
        "cpu": meta["client_health"]["cpu_share_of_one_core"]["mean"] or 0.0,
    }


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    top = ceiling()
    print(f"closed-loop ceiling (28 connections, 256 tokens): {top:.0f} req/s")
    print(f"{workers} client process(es)")
    print("rate req/s   lag p50 ms   lag p99 ms   lag max ms   sent req/s   KS p   client CPU")
    for rate in (100.0, round(0.8 * top)):
        rs = [once(rate, n, workers) for _ in range(3)]
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"{rate:10.0f} {med['p50']:12.3f} {med['p99']:12.3f} {med['max']:12.3f} {med['sent']:12.1f}"
            f" {med['ks']:6.2f} {med['cpu']:11.0%}"
        )


if __name__ == "__main__":
    main()
