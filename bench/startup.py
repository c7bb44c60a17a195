"""Start-up: time from launching `kvbench run` to its first measured request reaching the server
(bench/firehose.py records when it arrives), median of 5, on an idle machine.

    python bench/startup.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from common import ROOT, Firehose, run_argv

SCENARIO = """schema_version = 1
name = "startup"
[endpoint]
max_tokens = 1
[metrics]
enabled = false
[workload]
kind = "sweep"
lengths = [1000]
warm_repeats = 0
"""


def main() -> None:
    times = []
    for _ in range(5):
        with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=1) as fh:
            (Path(tmp) / "s.toml").write_text(SCENARIO)
            start = time.perf_counter_ns()
            subprocess.run(
                run_argv(Path(tmp) / "s.toml", fh.base_url, Path(tmp) / "out"),
                cwd=ROOT,
                capture_output=True,
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
                check=True,
            )
            first = fh.first_request()
            if first is not None:
                times.append((first - start) / 1e9)
    print(
        f"start -> first request: median {statistics.median(times):.2f} s (min {min(times):.2f}, "
        f"max {max(times):.2f}) over {len(times)} runs"
    )


if __name__ == "__main__":
    main()
