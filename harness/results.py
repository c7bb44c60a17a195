"""Result folders: `results/<scenario>/<UTC-timestamp>-<arm>/` with

- `requests.jsonl`: one JSON object per finished request, appended and flushed as it ends;
- `run.json`: the run's metadata and summary, written when the run starts (status "running"),
  and rewritten when it ends ("completed", "interrupted" or "failed"). A run.json still saying
  "running" after the process is gone belongs to a run that died: its requests.jsonl holds every
  request finished until then.

The format is documented in results/README.md; `schema_version` changes when it does.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Protocol

import orjson

from harness import __version__

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


class RecordSink(Protocol):
    def add(self, record: dict[str, Any]) -> None: ...


class RunWriter:
    def __init__(self, folder: Path, meta: dict[str, Any]) -> None:
        folder.mkdir(parents=True, exist_ok=False)
        self.folder = folder
        self.meta = {"schema_version": SCHEMA_VERSION, **meta, "status": "running"}
        self._requests: IO[bytes] = (folder / "requests.jsonl").open("ab")
        self.count = 0
        self._write_meta()

    def add(self, record: dict[str, Any]) -> None:
        self._requests.write(orjson.dumps(record) + b"\n")
        self._requests.flush()
        self.count += 1

    def finish(self, status: str, **extra: Any) -> None:
        self.meta.update(extra)
        self.meta["status"] = status
        self._write_meta()
        self._requests.close()

    def _write_meta(self) -> None:
        tmp = self.folder / "run.json.tmp"
        tmp.write_text(json.dumps(self.meta, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, self.folder / "run.json")


# What the end-of-run summary needs of each request: a million requests' per-token gaps need not
# be in memory at once to summarise the run.
SUMMARY_FIELDS = (
    "ok",
    "phase",
    "target_tokens",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "start_s",
    "ttft_s",
    "e2e_s",
)


def read_requests(folder: Path, fields: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """Every complete line of requests.jsonl (only `fields` of each, if given); a line cut short
    by a crash is skipped."""
    out = []
    with (folder / "requests.jsonl").open("rb") as f:
        for line in f:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            out.append({k: rec.get(k) for k in fields} if fields else rec)
    return out
