"""Shared by the bench scripts: run `kvbench run` against an emulator that logs its own send
times, and pair every request with the server's view of it."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The tree whose kvbench the benches run (bench/ab.py points it at an older commit in turn).
CODE: dict[str, Any] = {"root": ROOT}  # and "ca_file": the CA an https firehose's certificate is from

from harness.emulator.serve import EmbeddedEmulator  # noqa: E402
from harness.results import read_requests  # noqa: E402

SERVER_CORE = 1


def pin(cores: set[int]) -> None:
    """Pin this process (and what it starts) to these cores, where the OS allows it."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, cores)


def client_cores(workers: int = 1) -> set[int]:
    """Core 0 on a 2-core machine; with more cores every core but the server's. Several workers
    that would not get a core each also share the server's core."""
    n = os.cpu_count() or 1
    spare = {0} if n <= 2 else set(range(n)) - {SERVER_CORE}
    return spare if workers <= len(spare) else set(range(n))


def run_paired(scenario_toml: str, emulator_scale: float, profile: str = "redbooks-g4") -> list[dict[str, Any]]:
    """Run a scenario (TOML text without schema_version) against an emulator pinned to core 1,
    with the client on core 0; return each request's record with `server` = the server's log line
    and `client_ft_ns` = the client's first-token time on the same monotonic clock."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        (t / "s.toml").write_text("schema_version = 1\n" + scenario_toml)
        log = t / "server.jsonl"
        pin({SERVER_CORE})
        with EmbeddedEmulator(profile, emulator_scale, timing_log=log) as emu:
            pin(client_cores())
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
            for r in read_requests(folder):
                rec = r.as_dict()
                rec["server"] = server[f"{meta['run_id']}-{meta['arm']}-{rec['id']}"]
                rec["client_start_ns"] = meta["t0_monotonic_ns"] + rec["start_s"] * 1e9
                rec["client_ft_ns"] = rec["client_start_ns"] + rec["ttft_s"] * 1e9
                out.append(rec)
        return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round((len(xs) - 1) * p / 100))]


def _server_start() -> None:
    """Core 1, and ahead of any client process that shares it (--workers on 2 cores): the server
    gets the CPU it needs as soon as it has work, as it would on a core of its own."""
    pin({SERVER_CORE})
    with contextlib.suppress(PermissionError):  # not root: the server shares its core as an equal
        os.nice(-10)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Firehose:
    """bench/firehose.py in its own process, pinned to core 1 (`script="engine.py"`: the
    engine-like server bench/engine.py instead)."""

    def __init__(
        self,
        ttft_ms: float = 200.0,
        tokens: int = 256,
        timing_log: Path | None = None,
        itl_ms: float = 0.0,
        script: str = "firehose.py",
        tls: bool = False,
        shape: tuple[str, ...] = (),
    ) -> None:
        """`shape`: more of firehose.py's flags (--framing, --first, --one-write)."""
        self.script = script
        self.args = ["--ttft-ms", str(ttft_ms), "--tokens", str(tokens), "--itl-ms", str(itl_ms), *shape]
        if timing_log:
            self.args += ["--timing-log", str(timing_log)]
        self.tls = tempfile.TemporaryDirectory() if tls else None
        if self.tls is not None:  # a certificate authority of its own, trusted by kvbench_run
            import trustme

            ca = trustme.CA()
            cert = ca.issue_cert("127.0.0.1")
            folder = Path(self.tls.name)
            ca.cert_pem.write_to_path(str(folder / "ca.pem"))
            cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
            cert.private_key_pem.write_to_path(str(folder / "key.pem"))
            self.args += ["--tls", str(folder / "cert.pem"), str(folder / "key.pem")]
            CODE["ca_file"] = str(folder / "ca.pem")
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self.first_request_ns: int | None = None

    def __enter__(self) -> Firehose:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / self.script), *self.args],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_server_start,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.base_url = line.split()[-1]
        return self

    def cpu_s(self) -> float:
        """CPU seconds the server has used so far."""
        assert self.proc is not None
        return process_cpu_s(self.proc.pid)

    def first_request(self) -> int | None:
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return int(line.split()[-1]) if line.startswith("first request") else None

    def __exit__(self, *_exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            if self.proc.stdout:
                self.proc.stdout.close()
        if self.tls is not None:
            CODE.pop("ca_file", None)
            self.tls.cleanup()


def kvbench_run(
    scenario_toml: str, base_url: str, out: Path, extra: list[str] | None = None, cores: set[int] | None = None
) -> list[Path]:
    """kvbench run on `cores` (default: client_cores()); returns its run folders."""
    (out / "s.toml").write_text("schema_version = 1\n" + scenario_toml)

    r = subprocess.run(
        [*run_argv(out / "s.toml", base_url, out / "out"), *(extra or [])],
        cwd=CODE["root"],
        env={**os.environ, "PYTHONPATH": str(CODE["root"]), **trust()},
        capture_output=True,
        text=True,
        preexec_fn=functools.partial(pin, cores or client_cores()),
    )
    if r.returncode != 0:
        raise SystemExit(r.stderr[-3000:])
    return sorted(p for p in (out / "out").glob("*/*") if p.is_dir())


def trust() -> dict[str, str]:
    """The environment that makes kvbench trust an https firehose's certificate."""
    return {"SSL_CERT_FILE": CODE["ca_file"]} if "ca_file" in CODE else {}


def run_argv(scenario: Path, base_url: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "harness", "run", str(scenario), "--endpoint", base_url, "--out", str(out)]


# The benches' scenarios: 256 tokens per request, ~1,000-token prompts from a pool of 50.
_HEAD = """
name = "{name}"
[endpoint]
max_tokens = 256
[metrics]
enabled = false
[workload]
pool = 50
prompt_tokens = 1000
"""
# Poisson arrivals at `rate` with 50 warm-up requests (schedule-lag and accuracy benches).
POISSON = (
    _HEAD
    + """kind = "open_loop"
arrivals = "poisson"
rate = {rate}
requests = {requests}
warmup_requests = 50
"""
)
# A streaming closed loop (ceiling and accuracy benches).
STREAMING = (
    _HEAD
    + """kind = "closed_loop"
requests = {requests}
concurrency = {concurrency}
"""
)


def checkout(rev: str, into: Path) -> Path:
    """The tree of `rev`, unpacked (no worktree bookkeeping left behind)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
