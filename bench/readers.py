"""Peak memory and time of every reader of a long run's result folder (issue 56 item 10): the
report, the gate (TTFT and ITL p99, the error rate, req/s), the Parquet export and
`load().summary()`, each alone in a process of its own, its peak resident memory as the kernel
counts it (the child's rusage).

    python bench/big_folder.py 5000000 /tmp/big    # 10^7 records: two arms of 5x10^6
    python bench/readers.py /tmp/big/golden-loop
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

RULES = """[gate.thresholds]
ttft_s = ["p99 < 10.0"]
itl_s = ["p99 < 10.0"]
error_rate = ["value < 0.5"]
req_per_s = ["value > 0.1"]
"""
SUMMARY = "import sys, harness; print(harness.load(sys.argv[1]).summary().T.to_string())"


def measured(argv: list[str]) -> tuple[float, float, int]:
    """Seconds, peak RSS (MB) and exit code of one command."""
    t0 = time.monotonic()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.stderr is not None:
        child.stderr.close()
    return time.monotonic() - t0, usage.ru_maxrss / 1024, child.returncode


def main(folder: Path) -> None:
    kvbench = [sys.executable, "-m", "harness"]
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.toml"
        rules.write_text(RULES)
        commands = {
            "kvbench report": [*kvbench, "report", str(folder), "-o", f"{tmp}/r.html"],
            "kvbench gate --rules": [*kvbench, "gate", str(folder), "--rules", str(rules)],
            "kvbench export --format parquet": [
                *kvbench,
                "export",
                str(folder),
                "--format",
                "parquet",
                "-o",
                f"{tmp}/x.parquet",
            ],
            "load().summary()": [sys.executable, "-c", SUMMARY, str(folder)],
        }
        print("| command | time | peak RSS | exit |\n|---|---|---|---|")
        for name, argv in commands.items():
            seconds, mb, code = measured(argv)
            print(f"| `{name}` | {seconds:.1f} s | {mb:,.0f} MB | {code} |", flush=True)


if __name__ == "__main__":
    os.chdir(ROOT)
    main(Path(sys.argv[1]))
