"""How far kvbench's first-token time is from the server's own send time: bench/firehose.py
(core 1) sends the first token 200 ms after each request arrives and logs when it did (monotonic
ns); kvbench (core 0) then receives 256 tokens per request, either paced (one every 10 ms, as an
engine decodes) or all at once (the worst case for the client: bursts of 40 KB to parse while
other streams wait for their first token), at 28, 100 and 256 connections.

    python bench/ttft_accuracy.py [requests]     # default 1500

Prints, per concurrency: the client's throughput, and mean / p50 / p99 / max of (client
first-token time - server send time) in ms, on one clock. Compare req/s with bench/ceiling.py's
to see how loaded the client was.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from common import STREAMING, Firehose, kvbench_run, pct

from harness.results import read_requests


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    print("tokens       connections  req/s  client_cpu  error_mean_ms  p50_ms  p99_ms  max_ms")
    for itl, conc in ((10.0, 28), (10.0, 256), (0.0, 28), (0.0, 100), (0.0, 256)):
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "server.jsonl"
            with Firehose(ttft_ms=200, tokens=256, timing_log=log, itl_ms=itl) as fh:
                (folder,) = kvbench_run(
                    STREAMING.format(name="accuracy", requests=n, concurrency=conc), fh.base_url, Path(tmp)
                )
            meta = json.loads((folder / "run.json").read_text())
            sent = {d["request_id"]: d["first_token_ns"] for d in map(json.loads, log.read_text().splitlines())}
            errs = []
            for r in read_requests(folder):
                client = meta["t0_monotonic_ns"] + (r["start_s"] + r["ttft_s"]) * 1e9
                errs.append((client - sent[f"{meta['run_id']}-default-{r['id']}"]) / 1e6)
            cpu = meta["client_health"]["cpu_share_of_one_core"]["mean"] or 0
            pace = "paced 10 ms" if itl else "all at once"
            print(
                f"{pace:11s}  {conc:11d}  {meta['summary']['req_per_s']:5.0f}  {cpu:10.0%}"
                f"  {sum(errs) / len(errs):13.3f}"
                f"  {pct(errs, 50):6.3f}  {pct(errs, 99):6.3f}  {max(errs):6.2f}"
            )


if __name__ == "__main__":
    main()
