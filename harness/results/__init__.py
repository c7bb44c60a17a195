"""Result folders, both ways: this module alone writes and reads them (as asv's Results does).

`results/<scenario>/<UTC-timestamp>-<arm>/` holds
- `requests.jsonl`: one `RequestRecord` per line, appended and flushed as each request ends;
- `run.json`: the run's metadata and summary, written when the run starts (status "running"),
  and rewritten when it ends ("completed", "interrupted" or "failed"). A run.json still saying
  "running" after the process is gone belongs to a run that died: its requests.jsonl holds every
  request finished until then;
- `metrics.json`, `traffic.json`, `traffic.jsonl`: read here, written by scrape.py and traffic/.

The format is documented in results/README.md; `SCHEMA_VERSION` changes when it does.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import orjson

from harness import __version__
from harness.core.errors import InputError, files_error, lines, open_regular, read_input, replaced, write_file
from harness.results.record import CUT_SHORT, KIND_FIELDS_MAX, RECORD_MAX_BYTES, KindRecord, RequestRecord, Scalar
from harness.results.table import Table, read_table

__all__ = ["KIND_FIELDS_MAX", "RECORD_MAX_BYTES", "KindRecord", "RequestRecord", "Scalar", "Table", "read_table"]

SCHEMA_VERSION = 1


def utc_stamp(dt: datetime) -> str:
    return dt.strftime("%Y%m%dT%H%M%SZ")


def iso(dt: datetime) -> str:
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
    }


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def versions() -> dict[str, Any]:
    return {"kvbench": __version__, "git_commit": git_commit()}


class RunWriter:
    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        folder.mkdir(parents=True, exist_ok=False)
        self.folder = folder
        self.meta = {"schema_version": SCHEMA_VERSION, **meta, "status": "running"}
        self._requests: IO[bytes] = (folder / REQUESTS).open("ab")
        self.count = 0
        self._write_meta()

    def add(self, record: RequestRecord) -> None:
        try:
            self._requests.write(record.to_json() + b"\n")
            self._requests.flush()
        except OSError as e:
            raise files_error(e, str(self.folder / REQUESTS)) from None
        self.count += 1

    def add_lines(self, lines: list[bytes]) -> None:
        """Records other processes serialized (RequestRecord.to_json), in one write."""
        try:
            self._requests.write(b"".join(line + b"\n" for line in lines))
            self._requests.flush()
        except OSError as e:
            raise files_error(e, str(self.folder / REQUESTS)) from None
        self.count += len(lines)

    def reorder(self) -> None:
        """The records written so far, put in start order and numbered from 1: requests.jsonl
        of a run whose workers' records came in as each ended (distributed/). Replaced at once."""
        path = self.folder / REQUESTS
        records = sorted(read_requests(path), key=lambda r: r.start_s)
        self._requests.close()
        with replaced(path) as tmp, tmp.open("wb") as f:
            f.writelines(replace(r, id=i).to_json() + b"\n" for i, r in enumerate(records, 1))
        try:
            self._requests = path.open("ab")
        except OSError as e:
            raise files_error(e, str(path)) from None

    def finish(self, status: str, keep_open: bool = False, **extra: Any) -> None:
        """Write run.json with its final status (`keep_open`: a status said early, on a signal;
        the arm's records still come, and finish is called again)."""
        self.meta.update(extra)
        self.meta["status"] = status
        if keep_open:
            self._write_meta()
            return
        try:
            self._write_meta()
        finally:
            with contextlib.suppress(OSError):  # what could not be flushed is lost either way
                self._requests.close()

    def _write_meta(self) -> None:
        write_file(self.folder / RUN, json.dumps(self.meta, indent=2, default=str) + "\n")


REQUESTS = "requests.jsonl"
RUN = "run.json"
RESULT_JSON_MAX_BYTES = 256 << 20


def read_requests(path: Path, itl: bool = True, skipped: list[str] | None = None) -> list[RequestRecord]:
    """Every readable line of a requests file (`path`: the file, or its run folder). A line that
    is not a record (cut short by a crash, or damaged) is left out and, when `skipped` is given,
    said there: file, line and why."""
    return list(iter_requests(path, itl, skipped))


def iter_requests(path: Path, itl: bool = True, skipped: list[str] | None = None) -> Iterator[RequestRecord]:
    """read_requests a record at a time, for readers that need not hold a run's records at once
    (`kvbench export --table requests` of a day-long run)."""
    file = path / REQUESTS if path.is_dir() else path
    with open_regular(file, "requests file") as f:
        for n, _, line in lines(f, RECORD_MAX_BYTES):
            if line is None:
                if skipped is not None:
                    skipped.append(f"{file}:{n}: longer than {RECORD_MAX_BYTES >> 20} MiB: not a record")
                continue
            try:
                record = RequestRecord.from_json(orjson.loads(line), itl)
            except (orjson.JSONDecodeError, ValueError) as e:
                if skipped is not None:
                    why = CUT_SHORT if not line.endswith(b"\n") else str(e)
                    skipped.append(f"{file}:{n}: {why}")
                continue
            yield record


@dataclass
class RunResult:
    """One arm's result folder as read back: run.json, its records, and the side files."""

    folder: Path
    meta: dict[str, Any]
    records: Table  # columns, and each record read back from its line (results/table.py)
    traffic: dict[str, Any] | None = None  # traffic.json
    traffic_rows: list[dict[str, Any]] = field(default_factory=list)  # traffic.jsonl
    server_metrics: dict[str, Any] | None = None  # metrics.json
    skipped: list[str] = field(default_factory=list)  # damaged lines of requests.jsonl and traffic.jsonl

    @property
    def label(self) -> str:
        at = ""
        if self.load.get("mode") == "rate" and self.rate is not None:
            at = f"@{self.rate:.4g}req/s" + (f",n={n}" if (n := self.load.get("requests")) else "")
        elif self.load.get("mode"):
            at = f"@{self.load['mode']}"
        return f"{self.meta.get('scenario_name', '?')}/{self.meta.get('arm', '?')}{at}"

    @property
    def arm(self) -> str:
        return str(self.meta.get("arm"))

    @property
    def scenario(self) -> dict[str, Any]:
        return self.meta.get("scenario") or {}

    @property
    def kind(self) -> str:
        return str(self.scenario.get("workload", {}).get("kind", ""))

    @property
    def load(self) -> dict[str, Any]:
        """Open loop: the load this folder ran at (mode "rate", "serial" or "saturated"; rate
        in req/s for "rate"); {} for other kinds."""
        got = self.meta.get("load")
        return got if isinstance(got, dict) else {}

    @property
    def rate(self) -> float | None:
        r = self.load.get("rate")
        return float(r) if isinstance(r, int | float) and not isinstance(r, bool) else None

    @property
    def reference_test(self) -> str | None:
        return (self.scenario.get("reference") or {}).get("test")


def _run_folders(path: Path) -> list[Path]:
    """A run folder, or a scenario's folder (its newest run: all arms of it), or a results root
    (the newest run of every scenario)."""
    if (path / RUN).is_file():
        return [path]
    runs = sorted(p.parent for p in path.glob(f"*/{RUN}"))
    if runs:
        ids = {p: _run_id(p) for p in runs}
        newest = max(ids.values())
        return [p for p in runs if ids[p] == newest]
    nested = sorted({p.parent.parent for p in path.glob(f"*/*/{RUN}")})
    return [f for scenario in nested for f in _run_folders(scenario)]


def _run_id(folder: Path) -> str:
    """The run a folder's run.json says it belongs to (to find a scenario's newest run)."""
    meta = _json_file(folder / RUN)
    found = meta.get("run_id") if isinstance(meta, dict) else None
    if not isinstance(found, str):
        raise InputError(f"{folder / RUN}: run_id: expected the run's id (text), got {json.dumps(found)[:40]}")
    return found


def _json_file(path: Path) -> Any:
    text = read_input(path, "result file", RESULT_JSON_MAX_BYTES)
    try:
        return json.loads(text)
    except ValueError as e:
        raise InputError(f"{path}: unreadable: {e}") from None
    except RecursionError:
        raise InputError(f"{path}: unreadable: nested too deeply") from None


_NUMBER_OR_INT = (int, float)
# What readers rely on in run.json, by type; a key may be absent or null. Nested tables are dicts,
# lists of one type are one-element lists.
_RUN_JSON: dict[str, Any] = {
    **dict.fromkeys(
        ("run_id", "scenario_name", "scenario_file", "scenario_hash", "arm", "status", "endpoint", "model"), str
    ),
    **dict.fromkeys(("started", "ended", "times", "prompt_counting", "error"), str),
    "time_scale": _NUMBER_OR_INT,
    "emulated": bool,
    "t0_monotonic_ns": int,
    "cold_cached_allowance": int,
    "warnings": [str],
    "versions": {"kvbench": str, "git_commit": str},
    "client": {"hostname": str, "os": str, "cpu": str, "cores": int, "python": str, "implementation": str},
    "emulator": {
        "profile": str,
        "time_scale": _NUMBER_OR_INT,
        "lateness": {
            "requests": int,
            "time_scale": _NUMBER_OR_INT,
            "share_of_modelled_ttft": {"p50": _NUMBER_OR_INT, "p99": _NUMBER_OR_INT},
            "first_token_late_s": {"p50": _NUMBER_OR_INT, "p99": _NUMBER_OR_INT, "max": _NUMBER_OR_INT},
        },
    },
    "client_health": {
        "loop_lag_ms": {"p99": _NUMBER_OR_INT},
        "cpu_share_of_one_core": {"mean": _NUMBER_OR_INT},
        "warning": str,
    },
    "summary": {},
    "load": {"mode": str, "rate": _NUMBER_OR_INT, "concurrency": int, "index": int, "requests": int},
    "scenario": {
        # the kind's own keys: those read here by name (each kind writes its own set)
        "workload": {"kind": str, "concurrency": int, "lengths": [int], "shared_prefix_tokens": int},
        "reference": {"test": str},
        "gate": {},
        "model": {"kv_bytes_per_token": int},
    },
}


_REQUIRED = ("run_id", "scenario_name", "arm", "status", "scenario")
# What readers rely on in metrics.json (each of its `phases` as _METRICS_PHASE) and traffic.json
_METRICS_JSON: dict[str, Any] = {"phases": {}, "unreachable": {}}
_METRICS_PHASE: dict[str, Any] = {
    "requests": int,
    "server_hit_ratio": _NUMBER_OR_INT,
    "mapped": {
        "families": [str],
        **dict.fromkeys(
            (
                "dynamo_router_kv_hit_ratio",
                "external_hit_tokens",
                "kvbm_matched_tokens",
                "kvbm_onboard_blocks_d2d",
                "kvbm_offload_blocks_d2d",
                "prefix_cache_hit_tokens",
            ),
            _NUMBER_OR_INT,
        ),
        "tier_hit_tokens": {},
        "cached_tokens_by_source": {},
    },
    **dict.fromkeys(("client_ttft_mean_s", "server_ttft_mean_s", "client_minus_server_ttft_s"), _NUMBER_OR_INT),
}
_TRAFFIC_JSON: dict[str, Any] = {
    "tool": str,
    "emulated": bool,
    "note": str,
    "warnings": [str],
    "per_client": {},
    **dict.fromkeys(("target_bytes_per_s", "achieved_bytes_per_s", "achieved_share"), _NUMBER_OR_INT),
}


def _side_file(path: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """A side file of a run folder (metrics.json, traffic.json): a JSON object whose keys readers
    rely on have the types `spec` says; InputError naming the first that does not."""
    got = _json_file(path)
    if not isinstance(got, dict):
        raise InputError(f"{path}: expected a JSON object, got {json.dumps(got)[:40]}")
    _check_types(got, spec, str(path))
    return got


def _check_types(value: Any, spec: Any, where: str) -> None:
    """Raise InputError naming the first key of `value` that is not of the type `spec` says."""
    if value is None:
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise InputError(f"{where}: expected an object, got {json.dumps(value)[:40]}")
        for k, sub in spec.items():
            _check_types(value.get(k), sub, f"{where}.{k}")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise InputError(f"{where}: expected a list, got {json.dumps(value)[:40]}")
        for i, v in enumerate(value):
            _check_types(v, spec[0], f"{where}[{i}]")
    elif not isinstance(value, spec) or (isinstance(value, bool) and spec is not bool):
        raise InputError(f"{where}: expected {getattr(spec, '__name__', 'a number')}, got {json.dumps(value)[:40]}")


def read_run(folder: Path, itl: bool = True, records: bool = True) -> RunResult:
    """A run folder: run.json checked, then its records (none read with `records=False`: for a
    reader that streams them with iter_requests, or needs run.json alone) and side files."""
    meta = _json_file(folder / RUN)
    if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA_VERSION:
        version = meta.get("schema_version") if isinstance(meta, dict) else None
        raise InputError(f"{folder / RUN}: schema_version {version!r}, expected {SCHEMA_VERSION}")
    _check_types(meta, _RUN_JSON, str(folder / RUN))
    for key in _REQUIRED:  # written when the run starts: every run.json kvbench wrote has them
        if meta.get(key) is None:
            raise InputError(f"{folder / RUN}: {key}: missing; is this a run.json kvbench wrote?")
    if not (meta["scenario"].get("workload") or {}).get("kind"):
        raise InputError(f"{folder / RUN}: scenario.workload.kind: missing; is this a run.json kvbench wrote?")
    skipped: list[str] = []
    held = records and (folder / REQUESTS).exists()
    read = read_table(folder / REQUESTS, itl, skipped) if held else Table.of([])
    run = RunResult(folder, meta, read, skipped=skipped)
    if (folder / "metrics.json").exists():
        run.server_metrics = _side_file(folder / "metrics.json", _METRICS_JSON)
        for name, phase in (run.server_metrics.get("phases") or {}).items():
            _check_types(phase, _METRICS_PHASE, f"{folder / 'metrics.json'}.phases.{name}")
    if (folder / "traffic.json").exists():
        run.traffic = _side_file(folder / "traffic.json", _TRAFFIC_JSON)
        if (folder / "traffic.jsonl").exists():
            run.traffic_rows = _traffic_rows(folder / "traffic.jsonl", skipped)
    return run


TRAFFIC_FIELDS = ("t_s", "read_bps", "write_bps")  # what a traffic.jsonl line must hold, as numbers


def _traffic_rows(file: Path, skipped: list[str]) -> list[dict[str, Any]]:
    """The competing traffic's time series; a line that is not one (cut short, not JSON, not
    UTF-8, a field missing or not a number) is left out and said in `skipped`."""
    rows = []
    with open_regular(file, "traffic file") as f:
        for n, _, line in lines(f, RECORD_MAX_BYTES):
            if line is None:
                skipped.append(f"{file}:{n}: longer than {RECORD_MAX_BYTES >> 20} MiB")
                continue
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                skipped.append(f"{file}:{n}: {e}")
                continue
            if not isinstance(row, dict) or not all(_finite(row.get(k)) for k in TRAFFIC_FIELDS):
                skipped.append(f"{file}:{n}: expected numbers {', '.join(TRAFFIC_FIELDS)}")
                continue
            rows.append(row)
    return rows


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def load_runs(paths: list[Path], itl: bool = True, records: bool = True) -> list[RunResult]:
    """Run folders, scenario folders (all arms of the newest run) or a results root (read_run's
    `itl` and `records`)."""
    out: list[RunResult] = []
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such result folder")
        folders = _run_folders(path)
        if not folders:
            raise InputError(f"{path}: no run.json here or in the folders below (is this a kvbench result folder?)")
        out += [read_run(f, itl, records) for f in folders]
    return out


def skipped_warning(runs: list[RunResult]) -> str | None:
    """What readers tell the user when lines of requests.jsonl were left out."""
    lines = [line for r in runs for line in r.skipped]
    if not lines:
        return None
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return f"{len(lines)} line(s) of requests.jsonl or traffic.jsonl were damaged and left out: {lines[0]}{more}"
