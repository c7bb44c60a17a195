"""Client-side cost of long prompts: for 1K, 10K and 130K-token prompts, the gap between the
client's TTFT and the server's own (receive -> first token send) TTFT, i.e. what the client and
the wire add.

    python bench/long_prompt.py
"""

from __future__ import annotations

from common import pct, run_paired

SCENARIO = """
name = "long"
[endpoint]
max_tokens = 1
[workload]
kind = "sweep"
lengths = [1000, 10000, 130000]
warm_repeats = 4
repetitions = 2
"""


def main() -> None:
    recs = run_paired(SCENARIO, emulator_scale=1.0)
    print("tokens  requests  client_ttft_minus_server_ttft_ms(p50)  (max)")
    for n in (1000, 10000, 130000):
        d = [
            (r["client_ft_ns"] - r["client_start_ns"] - (r["server"]["first_token_ns"] - r["server"]["recv_ns"])) / 1e6
            for r in recs
            if r["target_tokens"] == n and r["ok"]
        ]
        print(f"{n:6d}  {len(d):8d}  {pct(d, 50):38.3f}  {max(d):6.3f}")


if __name__ == "__main__":
    main()
