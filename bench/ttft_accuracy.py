"""How far kvbench's first-token time is from the server's own send time, on one monotonic
clock, the server on core 1 and kvbench on core 0.

First against bench/engine.py, a server that streams as an engine does (aiohttp, one write per
event, each request's own chunk id and token texts; the role chunk at once, the first token
200 ms after the request arrived, then 127 more 10 ms apart), at 28 connections: the product's
condition (`engine` rows; `python bench/ttft_accuracy.py N engine` runs only these). The first 28
requests, sent together at the start, are left out: the figure is the steady state's.

Then against bench/firehose.py (raw asyncio, identical pre-encoded chunks, the first token
200 ms after arrival), 256 tokens per request, either paced (one every 10 ms) or all at once
(the worst case for the client: bursts of 40 KB to parse while other streams wait for their
first token): 28 connections, then all at once with as many connections as make the client
stream at about 80 % of its ceiling (measured first, in the same run: TTFT 0, 28 connections;
the connection count is found by one trial run), then 256 connections as a stress case.

    python bench/ttft_accuracy.py [requests] [engine]     # default 1500

Prints, per row: the client's throughput (and its share of the ceiling), its CPU, and mean /
p50 / p99 / max of (client first-token time - server send time) in ms.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import POISSON, STREAMING, Firehose, kvbench_run, pct

from harness.results import read_requests

TTFT_S = 0.2
ENGINE_TOKENS, ENGINE_ITL_MS = 128, 10.0


def run(n: int, conc: int, itl_ms: float, ttft_ms: float = TTFT_S * 1e3) -> tuple[dict, list[float]]:
    """One closed-loop kvbench run against the firehose: (run.json, first-token errors in ms)."""
    return errors(STREAMING.format(name="accuracy", requests=n, concurrency=conc), itl_ms, ttft_ms)


def run_engine(n: int, conc: int = 28) -> tuple[dict, list[float]]:
    """One closed-loop run against the engine-like server: (run.json, first-token errors in ms of
    the requests after the first `conc`)."""
    scenario = STREAMING.format(name="accuracy", requests=n, concurrency=conc)
    return errors(scenario, ENGINE_ITL_MS, TTFT_S * 1e3, tokens=ENGINE_TOKENS, script="engine.py", skip=conc)


def run_open(n: int, rate: float) -> tuple[dict, list[float]]:
    """One open-loop run (tokens all at once): (run.json, first-token errors of measured requests).
    With Poisson arrivals, when requests start does not depend on how fast the client finishes
    the ones before (a closed loop's 28 streams, all started together, stay bunched closer
    together the faster the client is, and bunched first tokens wait for each other)."""
    return errors(POISSON.format(name="accuracy", rate=rate, requests=n), 0.0, TTFT_S * 1e3)


def errors(
    scenario: str, itl_ms: float, ttft_ms: float, tokens: int = 256, script: str = "firehose.py", skip: int = 0
) -> tuple[dict, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.jsonl"
        with Firehose(ttft_ms=ttft_ms, tokens=tokens, timing_log=log, itl_ms=itl_ms, script=script) as fh:
            (folder,) = kvbench_run(scenario, fh.base_url, Path(tmp))
        meta = json.loads((folder / "run.json").read_text())
        sent = {d["request_id"]: d["first_token_ns"] for d in map(json.loads, log.read_text().splitlines())}
        errs = []
        for r in read_requests(folder):
            if r.phase != "warmup" and r.id >= skip:
                client = meta["t0_monotonic_ns"] + (r.start_s + r.ttft_s) * 1e9
                errs.append((client - sent[f"{meta['run_id']}-default-{r.id}"]) / 1e6)
        return meta, errs


def row(name: str, conc: int, meta: dict, errs: list[float], ceiling: float | None = None) -> str:
    rps = meta["summary"]["req_per_s"]
    cpu = meta["client_health"]["cpu_share_of_one_core"]["mean"] or 0
    share = f"{rps / ceiling:10.0%}" if ceiling else f"{'':10s}"
    return (
        f"{name:16s}  {conc:11d}  {rps:5.0f}  {share}  {cpu:10.0%}"
        f"  {sum(errs) / len(errs):13.3f}  {pct(errs, 50):6.3f}  {pct(errs, 99):6.3f}  {max(errs):6.2f}"
    )


HEADER = "tokens            connections  req/s  of ceiling  client_cpu  error_mean_ms  p50_ms  p99_ms  max_ms"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    print(HEADER)
    for _ in range(3):
        meta, errs = run_engine(n)
        print(row(f"engine {ENGINE_ITL_MS:g} ms", 28, meta, errs))
    if sys.argv[2:] == ["engine"]:
        return
    ceiling = statistics.median(run(n, 28, 0.0, ttft_ms=0)[0]["summary"]["req_per_s"] for _ in range(3))
    print(f"client ceiling (TTFT 0, 28 connections, all at once; median of 3): {ceiling:.0f} req/s")
    # Connections for 80 % of the ceiling: a first guess from TTFT alone, corrected once by
    # what that guess achieved (responses take longer than TTFT to stream and parse).
    guess = round(0.8 * ceiling * TTFT_S)
    at_80 = min(1024, round(guess * 0.8 * ceiling / run(n, guess, 0.0)[0]["summary"]["req_per_s"]))
    print(HEADER)
    for itl, conc in ((10.0, 28), (0.0, 28), (0.0, at_80), (10.0, 256), (0.0, 256)):
        meta, errs = run(n, conc, itl)
        print(row("paced 10 ms" if itl else "all at once", conc, meta, errs, ceiling))


if __name__ == "__main__":
    main()
