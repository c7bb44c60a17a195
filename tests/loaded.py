"""The test suite on a loaded machine: a busy-loop process on every core (or `--hogs N`), then
`pytest` with the arguments given, as a user's laptop or a shared CI host runs it; prints the
load average seen and pytest's closing lines, and exits with pytest's code.

    python tests/loaded.py                      # the whole suite, every core busy
    python tests/loaded.py --hogs 4 -m "not engine" -x

A suite that passes here asserts no wall-clock duration (tests/README.md)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def hog() -> None:
    while True:  # at the suite's own priority: as busy as another job of the same user
        pass


def main(argv: list[str]) -> int:
    hogs = os.cpu_count() or 1
    if argv[:1] == ["--hogs"]:
        hogs, argv = int(argv[1]), argv[2:]
    procs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(hogs)]
    for p in procs:
        p.start()
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=ROOT)
        print(f"loaded: {hogs} busy processes; load average {os.getloadavg()[0]:.1f} at the end", flush=True)
        return r.returncode
    finally:
        for p in procs:
            if p.pid is not None:
                os.kill(p.pid, signal.SIGKILL)
            p.join()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
