"""Shared by the bench scripts: run `kvbench run` against an emulator that logs its own send
times, and pair every request with the server's view of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.emulator.serve import EmbeddedEmulator  # noqa: E402
from harness.results import read_requests  # noqa: E402


def pin(cpu: int) -> None:
    """Pin this process (and what it starts) to one core, where the OS allows it."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})


def run_paired(scenario_toml: str, emulator_scale: float, profile: str = "redbooks-g4") -> list[dict[str, Any]]:
    """Run a scenario (TOML text without schema_version) against an emulator pinned to core 1,
    with the client on core 0; return each request's record with `server` = the server's log line
    and `client_ft_ns` = the client's first-token time on the same monotonic clock."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "s.toml").write_text("schema_version = 1\n" + scenario_toml)
        log = t / "server.jsonl"
        pin(1)
        with EmbeddedEmulator(profile, emulator_scale, timing_log=log) as emu:
            pin(0)
            r = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "harness",
                    "run",
                    str(t / "s.toml"),
                    "--endpoint",
                    emu.base_url,
                    "--out",
                    str(t / "out"),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise SystemExit(r.stderr)
        server = {}
        for line in log.read_text().splitlines():
            d = json.loads(line)
            server[d["request_id"]] = d
        out = []
        for folder in sorted((t / "out").glob("*/*")):
            meta = json.loads((folder / "run.json").read_text())
            for rec in read_requests(folder):
                rec["server"] = server[f"{meta['run_id']}-{meta['arm']}-{rec['id']}"]
                rec["client_start_ns"] = meta["t0_monotonic_ns"] + rec["start_s"] * 1e9
                rec["client_ft_ns"] = rec["client_start_ns"] + rec["ttft_s"] * 1e9
                out.append(rec)
        return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * p / 100))]
