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
import functools
import json
import math
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Self, get_args, get_type_hints

import orjson

from harness import __version__
from harness.core.errors import InputError, files_error, lines, open_regular, read_input, replaced, write_file

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


Scalar = bool | int | float | str | None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request: one line of requests.jsonl (fields documented in results/README.md).
    Times are seconds since the request's start (`start_s`: since the arm's start), in model time."""

    id: int
    arm: str
    phase: str  # "cold" | "warm" (sweep), "run" (closed loop)
    prompt_id: str
    target_tokens: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    start_s: float
    ttft_s: float | None
    first_byte_s: float | None
    first_content_s: float | None
    headers_s: float | None
    e2e_s: float | None
    itl_s: list[float]
    ok: bool
    error: str | None
    error_kind: str | None  # "connect" | "http" | "timeout" | "stream" | "empty" | "protocol" | ... (results/README.md)
    http_status: int | None
    retried: bool
    # Written only where they apply (a sweep's lines have no `worker`, and so on).
    repeat: int | None = None  # sweep: 0 cold, 1.. warm
    worker: int | None = None  # closed loop: the connection that sent it
    schedule_index: int | None = None  # closed loop: its place in the drawn schedule
    process: int | None = None  # --workers N: the client process that sent it
    attempts: int | None = None  # 2 when it was sent again (see `retried`); absent in older results
    intended_s: float | None = None  # open loop: when the schedule meant it to be sent (vs start_s)
    held_s: float | None = None  # open loop: how long max_concurrency held it back before sending
    session: int | None = None  # sessions: the user's session
    turn: int | None = None  # sessions: its turn (1, 2, ...)
    idle_s: float | None = None  # sessions: since the end of the session's previous turn
    # warm_from (a tier below the engine's active KV): what the engine said of the step before
    # this warm request (tiers.py): tokens and bytes it read back, and how long that took
    warm_from: str | None = None
    restore_tokens: int | None = None
    restore_bytes: int | None = None
    restore_s: float | None = None
    # Where the first token's time came from: "kernel" (the kernel's receive stamp of the read
    # that carried it) or "user" (the time the client read it); how much later than the kernel's
    # stamp the client read it; how many later token chunks that read held (its stamp is theirs
    # when they arrived later: results/README.md)
    first_token_stamp: str | None = None
    first_token_late_s: float | None = None
    first_token_shared: int | None = None
    # the embedded emulator's: how late it sent the first token against its own model, beyond the
    # loop's timer granularity (model seconds); judged per figure (stats.EMULATOR_LATE_SHARE)
    emulator_late_s: float | None = None
    # the X-Request-Id the request was sent with (`id` is renumbered across processes; this joins
    # a record with the server's own logs)
    request_id: str | None = None
    # the workload kind's own fields, apart from those every kind shares: its KindRecord's
    # (`KindSpec.record`), read back typed by `TheKindsRecord.of(record)`
    kind_fields: dict[str, Scalar] | None = None

    @property
    def lag_s(self) -> float | None:
        """How late the request was sent against its schedule (open loop)."""
        return None if self.intended_s is None else self.start_s - self.intended_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT): (e2e - TTFT) / (tokens - 1)."""
        n = self.completion_tokens
        if self.e2e_s is None or self.ttft_s is None or n is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def to_json(self) -> bytes:
        d = self.as_dict()
        for f in _OPTIONAL:
            if d[f] is None:
                del d[f]
        return orjson.dumps(d)

    @classmethod
    def from_json(cls, d: Any, itl: bool = True) -> RequestRecord:
        """A parsed line; unknown keys (a later kvbench's) are ignored. `itl=False` leaves out the
        per-token gaps: a million requests' gaps need not be in memory to summarise a run.
        Raises ValueError naming the first field that is not what this format says."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        values: dict[str, Any] = {f: d.get(f) for f in _FIELDS}
        for f, kinds in _TYPES.items():
            v = values[f]
            if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
                raise ValueError(f"{f}: expected {_WHAT[kinds]}, got {json.dumps(v)[:40]}")
        gaps = d.get("itl_s") or []
        if not isinstance(gaps, list) or not all(type(g) is float or type(g) is int for g in gaps):
            raise ValueError("itl_s: expected a list of numbers")
        values["itl_s"] = gaps if itl else []
        for f in _REPEATED_TEXT:  # one string object per distinct value: a million records share a few
            if values[f] is not None:
                values[f] = sys.intern(values[f])
        values["ok"], values["retried"] = bool(d.get("ok")), bool(d.get("retried"))
        values["kind_fields"] = _kind_fields(d.get("kind_fields"))
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in _FIELDS}

    def end_s(self) -> float | None:
        return None if self.e2e_s is None else self.start_s + self.e2e_s

    @property
    def context_tokens(self) -> int | None:
        """The prompt's length: the server's count, else kvbench's target."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.target_tokens


_FIELDS = tuple(f.name for f in fields(RequestRecord))
_OPTIONAL = (
    "repeat",
    "worker",
    "schedule_index",
    "process",
    "attempts",
    "intended_s",
    "held_s",
    "session",
    "turn",
    "idle_s",
    "warm_from",
    "restore_tokens",
    "restore_bytes",
    "restore_s",
    "first_token_stamp",
    "first_token_late_s",
    "first_token_shared",
    "emulator_late_s",
    "request_id",
    "kind_fields",
)
_REPEATED_TEXT = ("arm", "phase", "prompt_id", "error_kind", "warm_from", "first_token_stamp")
_OPTIONAL_NUMBERS = ("intended_s", "held_s", "idle_s", "restore_s", "first_token_late_s", "emulator_late_s")
_OPTIONAL_TEXT = ("warm_from", "first_token_stamp", "request_id")
_NUMBER, _MAYBE_NUMBER, _MAYBE_INT, _MAYBE_TEXT = (
    (int, float),
    (int, float, type(None)),
    (int, type(None)),
    (str, type(None)),
)
_WHAT = {
    _NUMBER: "a number",
    _MAYBE_NUMBER: "a number or null",
    _MAYBE_INT: "an integer or null",
    _MAYBE_TEXT: "a string or null",
    (int,): "an integer",
    (str,): "a string",
    (bool, type(None)): "true or false",
}
_TYPES: dict[str, tuple[type, ...]] = {
    "id": (int,),
    "arm": (str,),
    "phase": (str,),
    "prompt_id": (str,),
    "start_s": _NUMBER,
    **{f: _MAYBE_INT for f in ("target_tokens", "prompt_tokens", "cached_tokens", "completion_tokens", "http_status")},
    **{f: _MAYBE_INT for f in _OPTIONAL if f not in (*_OPTIONAL_NUMBERS, *_OPTIONAL_TEXT, "kind_fields")},
    **{f: _MAYBE_NUMBER for f in ("ttft_s", "first_byte_s", "first_content_s", "headers_s", "e2e_s")},
    **{f: _MAYBE_NUMBER for f in _OPTIONAL_NUMBERS},
    **{f: _MAYBE_TEXT for f in ("error", "error_kind", *_OPTIONAL_TEXT)},
    **{f: (bool, type(None)) for f in ("ok", "retried")},
}


# A kind's own fields: at most this many, each a JSON scalar
KIND_FIELDS_MAX = 64
_SCALARS = (bool, int, float, str, type(None))


def _kind_fields(v: Any) -> dict[str, Scalar] | None:
    if v is None:
        return None
    if (
        not isinstance(v, dict)
        or len(v) > KIND_FIELDS_MAX
        or not all(isinstance(x, _SCALARS) and not (isinstance(x, float) and not math.isfinite(x)) for x in v.values())
    ):
        raise ValueError(
            f"kind_fields: expected an object of at most {KIND_FIELDS_MAX} numbers, texts, booleans or nulls"
        )
    return {str(k): sys.intern(x) if isinstance(x, str) else x for k, x in v.items()}


class KindRecord:
    """Base of a workload kind's own per-request fields (its `KindSpec.record`): a frozen
    dataclass of scalars (int, float, str, bool, each may be None). A request's record carries
    them as `kind_fields`, apart from the fields every kind shares; `of` gives them back typed.

        @dataclass(frozen=True)
        class RungRecord(KindRecord):
            rung: int
            rung_tokens: int
    """

    def fields(self) -> dict[str, Scalar]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def of(cls, record: RequestRecord) -> Self | None:
        """The record's kind fields as this type; None when it has none, or they do not fit (a
        record of another kind, or a line written by hand)."""
        got = record.kind_fields
        if got is None:
            return None
        values = {}
        for name, hint in _declared(cls):  # type: ignore[arg-type]  # (a class is hashable)
            v = got.get(name)
            if not _fits(v, hint):
                return None
            values[name] = v
        return cls(**values)


@functools.cache
def _declared(cls: type) -> tuple[tuple[str, Any], ...]:
    """A KindRecord type's fields and their types, worked out once per type (not per record)."""
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls))


def _fits(v: Any, hint: Any) -> bool:
    allowed = get_args(hint) or (hint,)
    if isinstance(v, bool):
        return bool in allowed
    if isinstance(v, int):
        return int in allowed or float in allowed
    return isinstance(v, tuple(a for a in allowed if isinstance(a, type)))


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
# Bounds of what a reader takes from a result folder (bounded memory, whatever a file holds): a
# line of requests.jsonl or traffic.jsonl (a record with 100,000 token gaps is about 1.5 MB), and a
# whole run.json or metrics.json (a day's time series of counters fits).
RECORD_MAX_BYTES = 64 << 20
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
        for n, line in lines(f, RECORD_MAX_BYTES):
            if line is None:
                if skipped is not None:
                    skipped.append(f"{file}:{n}: longer than {RECORD_MAX_BYTES >> 20} MiB: not a record")
                continue
            try:
                record = RequestRecord.from_json(orjson.loads(line), itl)
            except (orjson.JSONDecodeError, ValueError) as e:
                if skipped is not None:
                    why = "cut short (the run was stopped while writing it)" if not line.endswith(b"\n") else str(e)
                    skipped.append(f"{file}:{n}: {why}")
                continue
            yield record


@dataclass
class RunResult:
    """One arm's result folder as read back: run.json, its records, and the side files."""

    folder: Path
    meta: dict[str, Any]
    records: list[RequestRecord]
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
    read = read_requests(folder, itl, skipped) if records and (folder / REQUESTS).exists() else []
    run = RunResult(folder, meta, read, skipped=skipped)
    if (folder / "metrics.json").exists():
        run.server_metrics = _json_file(folder / "metrics.json")
    if (folder / "traffic.json").exists():
        run.traffic = _json_file(folder / "traffic.json")
        if (folder / "traffic.jsonl").exists():
            run.traffic_rows = _traffic_rows(folder / "traffic.jsonl", skipped)
    return run


TRAFFIC_FIELDS = ("t_s", "read_bps", "write_bps")  # what a traffic.jsonl line must hold, as numbers


def _traffic_rows(file: Path, skipped: list[str]) -> list[dict[str, Any]]:
    """The competing traffic's time series; a line that is not one (cut short, not JSON, not
    UTF-8, a field missing or not a number) is left out and said in `skipped`."""
    rows = []
    with open_regular(file, "traffic file") as f:
        for n, line in lines(f, RECORD_MAX_BYTES):
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
