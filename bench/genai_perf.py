"""kvbench against genai-perf's C++ client, perf_analyzer, on the same server in one run: one
process each on core 0 (bench/firehose.py on core 1, TTFT 0, 256 tokens per response sent at
once), 28 connections, ~1,000-word chat prompts from a pool of 50, in alternation. Medians of
the pairs, the ratio kvbench / perf_analyzer, each client's CPU and the server's (when the
server is near 100 % of its core, it was the limit, not the client).

perf_analyzer runs with the arguments genai-perf 0.0.16 gives it (`--async --service-kind openai
--endpoint v1/chat/completions --concurrency-range 28 --request-count N --input-data ...`);
genai-perf itself is not run: its parser stops at a usage chunk with `"choices": []`, which
every kvbench-compatible server may send. Its throughput is computed from its own export
(requests / (last response - first send)), as genai-perf does.

    python bench/genai_perf.py [requests] [pairs]       # defaults 3000, 3

Needs perf_analyzer: found as $KVBENCH_PERF_ANALYZER, else on PATH. To install it (no GPU needed;
tritonclient 2.51 is the last whose perf_analyzer runs on glibc 2.36, Debian 12):

    python3 -m venv /opt/perf-analyzer
    /opt/perf-analyzer/bin/pip install tritonclient==2.51.0 nvidia-cuda-runtime-cu12
    apt-get install libb64-0d
    KVBENCH_PERF_ANALYZER=/opt/perf-analyzer/bin/perf_analyzer python bench/genai_perf.py
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ceiling import once
from common import Firehose, client_cores, pin

from harness.inputs.prompts import VOCAB

POOL = 50
WORDS = 1000


def perf_analyzer() -> tuple[str, dict[str, str]]:
    """perf_analyzer's path and its environment (the CUDA runtime from its venv's wheel)."""
    exe = os.environ.get("KVBENCH_PERF_ANALYZER") or shutil.which("perf_analyzer")
    if not exe:
        raise SystemExit(__doc__.split("Needs perf_analyzer:")[1].strip())
    env = dict(os.environ)
    libs = sorted(Path(exe).resolve().parent.parent.glob("lib/python*/site-packages/nvidia/cuda_runtime/lib"))
    if libs:
        env["LD_LIBRARY_PATH"] = ":".join([str(libs[0]), *filter(None, [env.get("LD_LIBRARY_PATH")])])
    return exe, env


def inputs(path: Path) -> None:
    """perf_analyzer's input file: POOL chat requests of WORDS words, streamed, 256 tokens."""
    rng = random.Random(0)
    data = [
        {
            "payload": [
                {
                    "model": "firehose",
                    "messages": [{"role": "user", "content": " ".join(rng.choices(VOCAB, k=WORDS))}],
                    "stream": True,
                    "max_tokens": 256,
                }
            ]
        }
        for _ in range(POOL)
    ]
    path.write_text(json.dumps({"data": data}))


def run_perf_analyzer(n: int) -> dict[str, float]:
    """One perf_analyzer run: req/s, client CPU (share of one core) and the server's."""
    exe, env = perf_analyzer()
    with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=256) as fh:
        t = Path(tmp)
        inputs(t / "inputs.json")
        host = fh.base_url.split("//")[1].split("/")[0]
        argv = [exe, "-m", "firehose", "--async", "--stability-percentage", "999", "--request-count", str(n)]
        argv += ["-i", "http", "-u", host, "--concurrency-range", "28", "--service-kind", "openai"]
        argv += ["--endpoint", "v1/chat/completions", "--input-data", str(t / "inputs.json")]
        argv += ["--profile-export-file", str(t / "export.json")]
        server_before, start = fh.cpu_s(), time.monotonic()
        # its messages go to a file: a pipe read only at its end would fill and stop it
        with (t / "stderr").open("wb") as err:
            proc = subprocess.Popen(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=lambda: pin(client_cores())
            )
            status, usage = _wait(proc, HANG_S)
        wall = time.monotonic() - start
        server = (fh.cpu_s() - server_before) / wall
        stderr = (t / "stderr").read_text(errors="replace")
        if status == -9 or usage is None:
            print(f"perf_analyzer hung (no end in {HANG_S:g} s): this pair is left out", file=sys.stderr)
            return {}
        if status != 0:
            raise SystemExit(f"perf_analyzer failed ({status}): {stderr[-2000:]}")
        requests = json.loads((t / "export.json").read_text())["experiments"][0]["requests"]
    first = min(r["timestamp"] for r in requests)
    last = max(r["response_timestamps"][-1] for r in requests)
    return {
        "rps": len(requests) / ((last - first) / 1e9),
        "cpu": (usage.ru_utime + usage.ru_stime) / wall,
        "server": server,
    }


# perf_analyzer 2.51 now and then stops sending at 28 connections and never ends (its connections
# open, the server idle): such a run is killed and said, and the pair is left out
HANG_S = 120.0


def _wait(proc: subprocess.Popen[bytes], limit_s: float) -> tuple[int, resource.struct_rusage | None]:
    """Its exit status and resource use; killed after limit_s (status -9)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            return status, usage
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    return -9, None


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows: dict[str, list[dict[str, float]]] = {"perf_analyzer": [], "kvbench": []}
    for _ in range(pairs):
        theirs = run_perf_analyzer(n)
        if theirs:
            rows["perf_analyzer"].append(theirs)
            rows["kvbench"].append(once(n, 28, 1))
    med = statistics.median
    print(f"{n} requests, 28 connections, 256 tokens each; medians of {pairs} pairs (min-max)")
    print("client          req/s               client CPU  server CPU")
    for name, rs in rows.items():
        rps = [r["rps"] for r in rs]
        print(
            f"{name:14s}  {med(rps):5.0f} ({min(rps):.0f}-{max(rps):.0f})  "
            f"{med(r['cpu'] for r in rs):9.0%}  {med(r['server'] for r in rs):10.0%}"
        )
    ratios = sorted(k["rps"] / p["rps"] for p, k in zip(rows["perf_analyzer"], rows["kvbench"], strict=True))
    print(f"kvbench / perf_analyzer: {med(ratios):.2f} (pairs {ratios[0]:.2f}-{ratios[-1]:.2f})")


if __name__ == "__main__":
    main()
