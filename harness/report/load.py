"""Finding and reading result folders for reports, comparisons and gates."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis import frame
from harness.errors import InputError
from harness.results import read_requests


@dataclass
class LoadedRun:
    folder: Path
    meta: dict[str, Any]
    df: pd.DataFrame
    traffic: dict[str, Any] | None = None  # traffic.json
    traffic_rows: list[dict[str, Any]] | None = None  # traffic.jsonl
    server_metrics: dict[str, Any] | None = None  # metrics.json

    @property
    def label(self) -> str:
        return f"{self.meta.get('scenario_name', '?')}/{self.meta.get('arm', '?')}"

    @property
    def kind(self) -> str:
        return str(self.meta.get("scenario", {}).get("workload", {}).get("kind", ""))

    @property
    def reference_test(self) -> str | None:
        ref = self.meta.get("scenario", {}).get("reference") or {}
        return ref.get("test")


def _run_folders(path: Path) -> list[Path]:
    """A run folder, or a scenario's folder (its newest run: all arms of it), or a results root
    (the newest run of every scenario)."""
    if (path / "run.json").is_file():
        return [path]
    runs = sorted(p.parent for p in path.glob("*/run.json"))
    if runs:
        newest = max(json.loads((p / "run.json").read_text()).get("run_id", "") for p in runs)
        return [p for p in runs if json.loads((p / "run.json").read_text()).get("run_id", "") == newest]
    nested = sorted({p.parent.parent for p in path.glob("*/*/run.json")})
    return [f for scenario in nested for f in _run_folders(scenario)]


def load_runs(paths: list[Path]) -> list[LoadedRun]:
    out: list[LoadedRun] = []
    for path in paths:
        if not path.exists():
            raise InputError(f"{path}: no such result folder")
        folders = _run_folders(path)
        if not folders:
            raise InputError(f"{path}: no run.json here or in the folders below (is this a kvbench result folder?)")
        for f in folders:
            try:
                meta = json.loads((f / "run.json").read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise InputError(f"{f / 'run.json'}: unreadable: {e}") from None
            if meta.get("schema_version") != 1:
                raise InputError(f"{f / 'run.json'}: schema_version {meta.get('schema_version')!r}, expected 1")
            records = read_requests(f) if (f / "requests.jsonl").exists() else []
            run = LoadedRun(f, meta, frame(records))
            if (f / "metrics.json").exists():
                run.server_metrics = json.loads((f / "metrics.json").read_text(encoding="utf-8"))
            if (f / "traffic.json").exists():
                run.traffic = json.loads((f / "traffic.json").read_text(encoding="utf-8"))
                run.traffic_rows = (
                    [json.loads(line) for line in (f / "traffic.jsonl").read_text().splitlines() if line.strip()]
                    if (f / "traffic.jsonl").exists()
                    else []
                )
            out.append(run)
    return out
