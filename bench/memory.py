"""Client memory over a long run: `kvbench run` streams each request to disk, so its resident
memory should stay flat however many requests it sends. Samples the client's RSS every second
during a closed loop of N short requests (28 connections, 16 tokens each) against
bench/firehose.py.

    python bench/memory.py [requests]      # default 200000
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, Firehose, run_argv

SCENARIO = """schema_version = 1
name = "memory"
[endpoint]
max_tokens = 16
[metrics]
enabled = false
[workload]
kind = "closed_loop"
requests = {n}
concurrency = 28
pool = 100
prompt_tokens = 200
"""


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=16) as fh:
        (Path(tmp) / "s.toml").write_text(SCENARIO.format(n=n))
        proc = subprocess.Popen(
            run_argv(Path(tmp) / "s.toml", fh.base_url, Path(tmp) / "out"),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        samples = []
        while proc.poll() is None:
            if (m := rss_mb(proc.pid)) is not None:
                samples.append(m)
            time.sleep(1.0)
        assert proc.stderr is not None
        if proc.returncode != 0:
            raise SystemExit(proc.stderr.read()[-2000:])
        size = sum(f.stat().st_size for f in Path(tmp).rglob("requests.jsonl")) / 1e6
    k = len(samples)
    marks = {f"{p}%": samples[min(k - 1, k * p // 100)] for p in (10, 25, 50, 75, 90)}
    print(
        f"{n} requests in {k} s, requests.jsonl {size:.0f} MB; client RSS (MB) at "
        + ", ".join(f"{p} {v:.0f}" for p, v in marks.items())
        + f"; max {max(samples):.0f}"
    )


if __name__ == "__main__":
    main()
