"""How far kvbench's first-token time is from the server's own send time, at 28 and 256
connections on loopback (client and emulator pinned to different cores).

    python bench/ttft_accuracy.py

Prints, per concurrency: mean / p50 / p99 / max of (client first-token time - server send time)
in milliseconds, on one monotonic clock. Positive = the client saw it later (loopback transfer
plus client scheduling delay).
"""

from __future__ import annotations

from common import pct, run_paired

SCENARIO = """
name = "accuracy"
[endpoint]
max_tokens = 64
[workload]
kind = "closed_loop"
requests = {requests}
concurrency = {concurrency}
pool = 50
prompt_tokens = 1000
"""


def main() -> None:
    print("connections  requests  mean_ms  p50_ms  p99_ms  max_ms")
    for conc, n in ((28, 560), (256, 1024)):
        recs = run_paired(SCENARIO.format(requests=n, concurrency=conc), emulator_scale=1.0)
        d = [(r["client_ft_ns"] - r["server"]["first_token_ns"]) / 1e6 for r in recs if r["ok"]]
        print(f"{conc:11d}  {len(d):8d}  {sum(d) / len(d):7.3f}  {pct(d, 50):6.3f}  {pct(d, 99):6.3f}  {max(d):6.3f}")


if __name__ == "__main__":
    main()
