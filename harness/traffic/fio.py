"""fio, the real tool: a job file, `fio --output-format=json --status-interval=1` locally or
`fio --client=HOST ...` per client host (fio's own client/server mode spans the hosts), and the
JSON it prints turned into a per-second bandwidth timeline and per-client totals."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.config.traffic import TrafficCfg
from harness.core.children import die_with_parent
from harness.core.clock import ModelClock
from harness.core.errors import EndpointError
from harness.traffic.base import (
    TrafficResult,
    cleanup_directory,
    prepare_directory,
    settings_of,
    stop_process,
)

RUNTIME_S = 7 * 24 * 3600  # time_based for "as long as the run": kvbench stops fio itself
# What fio measures of a directory's reads, beside the restores an engine did from it (tiers.py):
# 1 MiB sequential reads of a file of its own, direct I/O (the page cache left out, as the
# restores' files were dropped from it), for at most this long.
PROBE_S, PROBE_BYTES, PROBE_BLOCK = 3, 256 << 20, 1 << 20


def read_probe(directory: Path) -> dict[str, Any]:
    """fio's sequential read bandwidth in `directory` (blocking: seconds): {"bytes_per_s", "job"},
    or {"error"} when fio is missing or failed (e.g. a file system without direct I/O)."""
    job = f"{PROBE_BLOCK >> 20} MiB sequential reads of a {PROBE_BYTES >> 20} MiB file, direct I/O, at most {PROBE_S} s"
    cmd = [
        "fio",
        "--name=kvbench-read-probe",
        f"--directory={directory}",
        "--rw=read",
        f"--bs={PROBE_BLOCK}",
        f"--size={PROBE_BYTES}",
        "--direct=1",
        "--ioengine=psync",
        f"--runtime={PROBE_S}",
        "--unlink=1",
        "--output-format=json",
    ]
    try:
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_S + 120)
    except FileNotFoundError:
        return {"error": "fio is not installed", "job": job}
    except subprocess.TimeoutExpired:
        return {"error": "fio did not finish", "job": job}
    objects = json_objects(got.stdout)
    jobs = objects[-1].get("jobs") if objects else None
    bw = jobs[0].get("read", {}).get("bw_bytes") if isinstance(jobs, list) and jobs else None
    if got.returncode != 0 or not isinstance(bw, int | float) or bw <= 0:
        return {"error": (got.stderr.strip() or "no read bandwidth in fio's output")[-300:], "job": job}
    return {"bytes_per_s": float(bw), "job": job}


def job_file(cfg: TrafficCfg, directory: str) -> str:
    clients = max(1, len(cfg.clients))
    jobs = clients * cfg.jobs_per_client
    per_job = int((cfg.target_bytes_per_s or 0) / jobs)
    if cfg.rw in ("rw", "randrw"):
        rate = f"{per_job * cfg.rwmixread // 100},{per_job * (100 - cfg.rwmixread) // 100}"
    else:
        rate = str(per_job)
    lines = [
        "[global]",
        f"directory={directory}",
        "filename_format=kvbench-traffic.$jobnum.$filenum",
        f"ioengine={'libaio' if cfg.direct else 'psync'}",
        f"iodepth={cfg.iodepth if cfg.direct else 1}",
        f"direct={int(cfg.direct)}",
        f"bs={cfg.block_size}",
        f"size={cfg.file_size}",
        f"rw={cfg.rw}",
        f"rwmixread={cfg.rwmixread}",
        "time_based=1",
        f"runtime={RUNTIME_S}",
        f"numjobs={cfg.jobs_per_client}",
        "unlink=1",
        "group_reporting=0",
    ]
    if per_job > 0:
        lines.append(f"rate={rate}")
    lines += ["", "[kvbench-traffic]", ""]
    return "\n".join(lines)


def client_args(cfg: TrafficCfg, job: Path) -> list[str]:
    args: list[str] = []
    for host in cfg.clients:
        name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
        args += [f"--client=ip:{name or host},{port or cfg.fio_port}", str(job)]
    return args


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object in fio's output: with --status-interval it prints one per interval, and
    it may print plain text (warnings, "terminating on signal") between them."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while (j := text.find("{", i)) >= 0:
        try:
            obj, i = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def snapshots(objects: list[dict[str, Any]], numjobs: int = 1) -> list[tuple[str, str, float, float, float]]:
    """(client, job, runtime s, cumulative read bytes, cumulative write bytes) for every job
    status in local (`jobs`: one object per interval) or client-mode (`client_stats`: every
    interval in one list) output. The `numjobs` clones of a job share its name; they come in the
    same order in every status, which tells them apart."""
    out = []
    for obj in objects:
        seen: dict[tuple[str, str], int] = defaultdict(int)
        for key, default_client in (("jobs", "local"), ("client_stats", None)):
            for j in obj.get(key) or ():
                name = str(j.get("jobname"))
                if name == "All clients":
                    continue
                client = default_client or f"{j.get('hostname')}:{j.get('port')}"
                clone = seen[(client, name)] % max(1, numjobs)
                seen[(client, name)] += 1
                out.append(
                    (
                        client,
                        f"{name}#{clone}",
                        float(j.get("job_runtime", 0)) / 1000.0,
                        float(j.get("read", {}).get("io_bytes", 0)),
                        float(j.get("write", {}).get("io_bytes", 0)),
                    )
                )
    return out


def timeline(
    snaps: list[tuple[str, str, float, float, float]], offset_s: float
) -> tuple[list[dict[str, Any]], dict[str, dict[str, float]]]:
    """Per-second read/write bandwidth per client (t_s = offset + seconds since fio started),
    and per-client totals."""
    by_job: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for client, job, t, r, w in snaps:
        by_job[(client, job)].append((t, r, w))
    # Per job and second: bytes moved and time covered; a job's rate in a second is their ratio,
    # and a client's is the sum over its jobs.
    per_job_sec: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    totals: dict[str, dict[str, float]] = defaultdict(lambda: {"read_bytes": 0.0, "write_bytes": 0.0, "seconds": 0.0})
    for (client, job), points in by_job.items():
        points.sort()
        prev = (0.0, 0.0, 0.0)
        for t, r, w in points:
            dt = t - prev[0]
            if dt > 0:
                acc = per_job_sec[(client, job, int((t + prev[0]) / 2))]
                acc[0] += r - prev[1]
                acc[1] += w - prev[2]
                acc[2] += dt
                prev = (t, r, w)
        t_end, r_end, w_end = points[-1]
        tot = totals[client]
        tot["read_bytes"] += r_end
        tot["write_bytes"] += w_end
        tot["seconds"] = max(tot["seconds"], t_end)
    per_sec: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (client, _, sec), (r, w, dt) in per_job_sec.items():
        per_sec[(client, sec)][0] += r / dt
        per_sec[(client, sec)][1] += w / dt
    rows = [
        {"t_s": round(offset_s + s, 3), "client": c, "read_bps": v[0], "write_bps": v[1]}
        for (c, s), v in sorted(per_sec.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]
    return rows, dict(totals)


class FioDriver:
    def __init__(self, cfg: TrafficCfg, folder: Path, run_name: str) -> None:
        self.cfg = cfg
        self.folder = folder
        self.run_name = run_name
        self.proc: subprocess.Popen[bytes] | None = None
        self.work: Path | None = None
        self.created: list[Path] = []
        self.started_mono = 0.0
        self.output = folder / "traffic-fio.json"

    async def start(self) -> None:
        if self.cfg.clients:
            directory = self.cfg.directory or ""  # on the client hosts: checked there by fio
        else:
            self.work, self.created = prepare_directory(
                self.cfg.directory or "", self.cfg.allow_nonempty_directory, self.run_name
            )
            directory = str(self.work)
        job = self.folder / "traffic-fio.job"
        job.write_text(job_file(self.cfg, directory), encoding="utf-8")
        cmd = ["fio", "--output-format=json", "--status-interval=1", f"--output={self.output}"]
        cmd += client_args(self.cfg, job) if self.cfg.clients else [str(job)]
        try:
            with (self.folder / "traffic-fio.log").open("wb") as log:  # the child keeps its own copy
                self.proc = subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
        except FileNotFoundError:
            self._cleanup()
            raise EndpointError('traffic.tool = "fio" but fio is not installed (Debian: apt-get install fio)') from None
        self.started_mono = time.monotonic()
        await asyncio.sleep(0.5)
        if self.proc.poll() is not None:
            said = (self.folder / "traffic-fio.log").read_text(errors="replace").strip()[-800:]
            self._cleanup()
            raise EndpointError(f"fio exited at once ({self.proc.returncode}): {said}")

    def _cleanup(self) -> None:
        if self.work is not None:
            cleanup_directory(self.work, self.created)
            self.work = None

    async def stop(self, clock: ModelClock) -> TrafficResult:
        try:
            if self.proc is not None:
                await asyncio.to_thread(stop_process, self.proc)
        finally:
            self._cleanup()
        text = self.output.read_text(errors="replace") if self.output.exists() else ""
        snaps = snapshots(json_objects(text), self.cfg.jobs_per_client)
        rows, totals = timeline(snaps, clock.at_mono(self.started_mono))
        res = TrafficResult(
            "fio",
            settings_of(self.cfg),
            self.cfg.target_bytes_per_s,
            rows,
            totals,
            note="fio JSON status every second; t_s from fio's own job runtimes",
        )
        if not snaps:
            res.warnings.append("fio reported no statistics (see traffic-fio.log)")
        return res
