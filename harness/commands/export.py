"""`kvbench export RESULT... --format csv|parquet|jsonl [-o FILE]`: a result's table on disk (or
on standard output), for spreadsheets, notebooks and dashboards: the frames of harness/analysis/frames.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from harness.core.errors import ExitCode, InputError, replaced, write_file

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("csv", "parquet", "jsonl")
TABLES = ("requests", "summary", "by_length")
EMPTY_WHY = {"by_length": " (per prompt length: only runs of a kind that sweeps lengths, such as `sweep`, have them)"}


def main(results: list[Path], fmt: str, table: str, output: Path | None) -> int:
    from rich.markup import escape

    from harness.analysis import frames
    from harness.monitor.progress import stderr_console
    from harness.results import skipped_warning

    if fmt not in FORMATS:
        raise InputError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if table not in TABLES:
        raise InputError(f"--table: expected one of {', '.join(TABLES)}, got {table!r}")
    if fmt == "parquet" and output is None:
        raise InputError("--format parquet: give the file to write with -o (Parquet is binary)")
    runs = frames.load(results)
    if warning := skipped_warning(runs.runs):
        stderr_console().print(f"[yellow]warning:[/] {escape(warning)}")
    frame = getattr(runs, table)()
    if frame.empty:
        raise InputError(f"--table {table}: no rows in {', '.join(map(str, results))}" + EMPTY_WHY.get(table, ""))
    if fmt == "parquet":
        assert output is not None
        write_parquet(frame, output)
    else:
        text = to_csv(frame) if fmt == "csv" else frame.to_json(orient="records", lines=True)
        if output is None:
            sys.stdout.write(text)
        else:
            write_file(output, text)
    if output is not None:
        print(output)
    return ExitCode.OK


# A text cell that starts with one of these is a formula to a spreadsheet (OWASP's CSV injection)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def to_csv(frame: pd.DataFrame) -> str:
    """CSV, with list cells (a request's `itl_s`) as JSON text: one cell each. A text cell that a
    spreadsheet would take for a formula (an error text a server wrote, say) gets a leading
    apostrophe, as OWASP advises, so that it is shown, never evaluated; numbers are left alone."""
    out = frame.copy()
    for col in out.columns:
        if out[col].map(lambda v: isinstance(v, list)).any():
            out[col] = out[col].map(json.dumps)
        if out[col].dtype.kind not in "biufcmM":  # text (object or a string dtype), not numbers or times
            out[col] = out[col].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(FORMULA_STARTS) else v)
    return str(out.to_csv(index=False))


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(
            "--format parquet needs pyarrow: pip install 'kvbench[parquet]' (or use --format csv or jsonl)"
        ) from None
    with replaced(path) as tmp:
        frame.to_parquet(tmp, index=False)
