"""Results as pandas DataFrames, for notebooks, spreadsheets and dashboards: `harness.load(paths)`
and `kvbench export`. The only module that imports pandas (the run path never loads it).

Every figure comes from the statistics core (stats.py), as run.json's summary, the report and the
gate take theirs, so the same run gives the same numbers here. Definitions as there: `ttft_s` and
`e2e_s` include the restore kvbench performed before a request where it did one (`restore_s`),
`request_ttft_s` is the request alone.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

from harness.analysis import capacity, stats
from harness.analysis.kinds import figures_of
from harness.config import kinds
from harness.core.errors import InputError
from harness.results import REQUESTS, RequestRecord, RunResult, iter_requests, load_runs

if TYPE_CHECKING:
    import pandas as pd

# What each row says of the run it came from, before the record's own fields
RUN_COLUMNS = ("run_id", "scenario", "arm", "kind", "load", "rate", "emulated", "status", "folder")
QUANTILES = ("mean", "p50", "p90", "p99")

# run.json's schedule_lag, as summary columns `schedule_lag_<key>`: how late requests left
# against their schedule (model seconds), how many max_concurrency held back, the load offered
LAG_COLUMNS = ("p50_s", "p99_s", "max_s", "held_back", "intended_req_per_s", "sent_req_per_s")


def _paths(paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """Folders as given, globs expanded (a pattern that matches nothing is an error)."""
    given = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[Path] = []
    for p in map(str, given):
        if any(c in p for c in "*?["):
            found = sorted(glob.glob(p))
            if not found:
                raise InputError(f"{p}: no result folder matches")
            out += map(Path, found)
        else:
            out.append(Path(p))
    return out


@dataclass
class Runs:
    """Result folders read back (each one arm, or one rate of an open loop's arm)."""

    runs: list[RunResult]

    @property
    def skipped(self) -> list[str]:
        """Lines of requests.jsonl left out (damaged or cut short): file, line and why."""
        return [line for r in self.runs for line in r.skipped]

    def requests(self) -> pd.DataFrame:
        """One row per request: the run's identity (RUN_COLUMNS), then every field of its record
        (times in seconds since the arm's start, `itl_s` a list), with `ttft_s` and `e2e_s` as the
        statistics core defines them, `request_ttft_s` the request alone, `tpot_s` and `lag_s`.
        Columns have pandas' nullable types (`Int64`, `Float64`, `string`, `boolean`): a count the
        server did not give is <NA>, not a float NaN."""
        import pandas as pd

        columns = request_columns(run.kind for run in self.runs)
        frames = [request_frame(run, run.records, columns) for run in self.runs]
        return pd.concat(frames, ignore_index=True) if frames else request_frame(None, [], columns)

    def summary(self) -> pd.DataFrame:
        """One row per arm (and per rate): the figures of run.json's summary and the report,
        from stats.summary; per-request metrics flattened as `<metric>_<mean|p50|p90|p99>`."""
        import pandas as pd

        rows = []
        for run in self.runs:
            slo = capacity.slo_of(run)
            s = figures_of(run.kind).summary(run.records, slo[0] if slo else None)
            row: dict[str, Any] = {**_identity(run), **{k: s[k] for k in ("requests", "completed", "failed")}}
            for metric in ("ttft_s", "request_ttft_s", "e2e_s", "tpot_s"):
                if isinstance(s.get(metric), dict):
                    row.update({f"{metric}_{q}": s[metric][q] for q in QUANTILES})
            for k in ("req_per_s", "steady_req_per_s", "output_tokens_per_s", "duration_s", "cached_share"):
                if k in s:
                    row[k] = s[k]
            if isinstance(slo := s.get("slo"), dict):
                row["goodput_req_per_s"], row["slo_share_met"] = slo.get("goodput_req_per_s"), slo.get("share_met")
            if isinstance(lag := s.get("schedule_lag"), dict) and lag.get("requests"):  # open loops and traces
                row.update({f"schedule_lag_{k}": lag[k] for k in LAG_COLUMNS})
            rows.append(row)
        return pd.DataFrame(rows)

    def by_length(self) -> pd.DataFrame:
        """Sweeps: one row per arm and prompt length, cold and warm TTFT medians and the speedup
        (stats.sweep_rows, as the report's table and the gate's `speedup`)."""
        import pandas as pd

        rows = [
            {**_identity(run), **row}
            for run in self.runs
            if kinds.get(run.kind).per_length
            for row in stats.sweep_rows(run.records)
        ]
        return pd.DataFrame(rows)


def load(paths: str | Path | Iterable[str | Path]) -> Runs:
    """Result folders (a run's arm folder, a scenario's results folder: the newest run of it, a
    results root), or glob patterns of them."""
    return Runs(load_runs(_paths(paths)))


def load_meta(paths: str | Path | Iterable[str | Path]) -> Runs:
    """load's folders with run.json and side files read, their records not (request_batches
    streams them)."""
    return Runs(load_runs(_paths(paths), records=False))


def _identity(run: RunResult) -> dict[str, Any]:
    m = run.meta
    return {
        "run_id": m.get("run_id"),
        "scenario": m.get("scenario_name"),
        "arm": run.arm,
        "kind": run.kind,
        "load": run.load.get("mode"),
        "rate": run.rate,
        "emulated": m.get("emulated"),
        "status": m.get("status"),
        "folder": str(run.folder),
    }


def request_frame(run: RunResult | None, records: Iterable[RequestRecord], columns: dict[str, str]) -> pd.DataFrame:
    """Runs.requests' rows of one run's `records` (any part of them: exports stream a long
    run's in batches), with `columns` (request_columns) whatever the batch holds: a kind's own
    fields as `<kind>.<field>`."""
    import pandas as pd

    ident = _identity(run) if run is not None else dict.fromkeys(RUN_COLUMNS)
    rows = []
    for r in records:
        d = r.as_dict()
        for k, v in (d.pop("kind_fields") or {}).items():
            if run is not None and (column := f"{run.kind}.{k}") in columns:
                d[column] = v
        d["request_ttft_s"] = r.ttft_s
        for metric in stats.WITH_RESTORE:
            if d[metric] is not None:
                d[metric] += r.restore_s or 0.0
        d["tpot_s"], d["lag_s"] = r.tpot_s, r.lag_s
        rows.append({**ident, **d})
    return pd.DataFrame(rows, columns=list(columns)).astype(columns)


def request_batches(runs: Iterable[RunResult], size: int) -> Iterator[pd.DataFrame]:
    """request_frame of each run read back without its records (read_run's `records=False`),
    `size` records at a time from requests.jsonl: a day-long run's table in bounded memory. Lines
    left out are added to the run's `skipped`."""
    runs = list(runs)
    columns = request_columns(run.kind for run in runs)
    for run in runs:
        if not (run.folder / REQUESTS).exists():
            continue
        batch: list[RequestRecord] = []
        for record in iter_requests(run.folder, skipped=run.skipped):
            batch.append(record)
            if len(batch) == size:
                yield request_frame(run, batch, columns)
                batch = []
        if batch:
            yield request_frame(run, batch, columns)


def request_columns(kind_names: Iterable[str] = ()) -> dict[str, str]:
    """The requests table's columns and their pandas types: RUN_COLUMNS, the record's fields (its
    arm is the run's), the derived ones, then each of these kinds' own fields (its KindSpec's
    `record`) as `<kind>.<field>`."""
    out = {
        **dict.fromkeys(("run_id", "scenario", "arm", "kind", "load", "status", "folder"), "string"),
        "rate": "Float64",
        "emulated": "boolean",
    }
    hints = get_type_hints(RequestRecord)
    for f in fields(RequestRecord):
        if f.name not in out and f.name != "kind_fields":
            out[f.name] = _PANDAS_TYPES.get(hints[f.name], "object")
    own = {}
    for name in dict.fromkeys(kind_names):
        record = _record_type(name)
        if record is not None:
            record_hints = get_type_hints(record)
            for f in fields(record):
                own[f"{name}.{f.name}"] = _PANDAS_TYPES.get(record_hints[f.name], "object")
    return {
        **{c: out[c] for c in RUN_COLUMNS},
        **{c: t for c, t in out.items() if c not in RUN_COLUMNS},
        **dict.fromkeys(("request_ttft_s", "tpot_s", "lag_s"), "Float64"),
        **own,
    }


def _record_type(kind: str) -> type | None:
    """The kind's own record fields' type; None for a kind without any, or not installed here."""
    try:
        return kinds.get(kind).record
    except InputError:
        return None


# A record field's type as a pandas nullable type (a list, `itl_s`, stays object)
_PANDAS_TYPES: dict[Any, str] = {
    int: "Int64",
    int | None: "Int64",
    float: "Float64",
    float | None: "Float64",
    str: "string",
    str | None: "string",
    bool: "boolean",
    bool | None: "boolean",
}
