"""`kvbench export RESULT... --format csv|parquet|jsonl [-o FILE]`: a result's table on disk (or
on standard output), for spreadsheets, notebooks and dashboards: the frames of harness/analysis/frames.py."""

from __future__ import annotations

import csv
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from harness.core.errors import ExitCode, InputError, replaced

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("csv", "parquet", "jsonl")
TABLES = ("requests", "summary", "by_length", "configurations")
EMPTY_WHY = {
    "by_length": " (per prompt length: only runs of a kind that sweeps lengths, such as `sweep`, have them)",
    "configurations": " (only `kvbench size` results have them)",
}


def main(results: list[Path], fmt: str, table: str, output: Path | None) -> int:
    from rich.markup import escape

    from harness.analysis import frames
    from harness.monitor.progress import stderr_console
    from harness.results import skipped_warning
    from harness.sizing import result as sizing

    if fmt not in FORMATS:
        raise InputError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if table not in TABLES:
        raise InputError(f"--table: expected one of {', '.join(TABLES)}, got {table!r}")
    if fmt == "parquet" and output is None:
        raise InputError("--format parquet: give the file to write with -o (Parquet is binary)")
    if fmt == "parquet":
        _need_pyarrow()
    empty = f"--table {table}: no rows in {', '.join(map(str, results))}" + EMPTY_WHY.get(table, "")
    if table == "configurations":  # a sizing's
        write_table(iter([configurations(results)]), fmt, output, empty)
    elif table == "requests" and (sized := sizing.of(results, "kvbench export")) is not None:
        write_table(sized_requests(sized), fmt, output, empty)
    else:
        if table == "requests":  # streamed: a day-long run's table in bounded memory
            runs = frames.load_meta(results)
            batches = frames.request_batches(runs.runs, BATCH_RECORDS)
        else:
            runs = frames.load(results)
            batches = iter([getattr(runs, table)()])
        write_table(batches, fmt, output, empty)
        if warning := skipped_warning(runs.runs):
            stderr_console().print(f"[yellow]warning:[/] {escape(warning)}")
    if output is not None:
        print(output)
    return ExitCode.OK


# Records converted at a time by a streamed export (about 60 MB of rows in flight)
BATCH_RECORDS = 50_000


def write_table(batches: Iterator[pd.DataFrame], fmt: str, output: Path | None, empty: str) -> None:
    """Write the table's batches to standard output, or to `output` whole or not at all. No rows
    at all is an InputError (`empty`), and then no file is written."""
    if output is None:
        _write_to(batches, fmt, sys.stdout, None, empty)
        return
    with replaced(output) as tmp:
        if fmt == "parquet":
            _write_to(batches, fmt, None, tmp, empty)
            return
        with tmp.open("w", encoding="utf-8") as f:
            _write_to(batches, fmt, f, None, empty)


def _write_to(batches: Iterator[pd.DataFrame], fmt: str, out: IO[str] | None, parquet: Path | None, empty: str) -> None:
    rows = 0
    writer = None
    try:
        for frame in batches:
            if frame.empty:
                continue
            if parquet is not None:
                writer = writer or ParquetBatches(parquet, frame)
                writer.write(frame)
            else:
                assert out is not None
                out.write(to_csv(frame, header=rows == 0) if fmt == "csv" else to_jsonl(frame))
            rows += len(frame)
    finally:
        if writer is not None:
            writer.close()
    if not rows:
        raise InputError(empty)


def configurations(results: list[Path]) -> pd.DataFrame:
    """`kvbench size` results: a row per configuration (as configurations.csv: its values in bytes
    and bytes/s, each tier's share, read bandwidth and knee, TTFT both ways, the SLO figures),
    after the sizing's name and folder; every figure simulated."""
    import pandas as pd

    from harness.sizing import result as sizing

    out = []
    for path in results:
        if not path.exists():
            raise InputError(f"{path}: no such result folder")
        for folder in sizing.folders(path):
            s = sizing.read(folder)
            out += [
                {"sizing": s.doc.get("name"), "folder": str(folder), "simulated": True, **r} for r in sizing.rows(s)
            ]
    return pd.DataFrame(out)


def sized_requests(folders: list[Path]) -> Iterator[pd.DataFrame]:
    """`kvbench size` results' rows, a request of a configuration each (their requests.csv.gz,
    BATCH_RECORDS at a time: bounded memory however long the trace), after the sizing's name and
    folder; every figure simulated. A result without rows says why."""
    import pandas as pd

    from harness.sizing import result as sizing

    for folder in folders:
        s = sizing.read(folder)
        path = folder / sizing.REQUESTS  # the one name kvbench writes, whatever sizing.json says
        sized = [c.get("index") for c in s.doc["configurations"] if isinstance(c, dict)]
        if s.doc.get("requests_file") != sizing.REQUESTS or not path.is_file():
            raise InputError(
                f"{folder}: no request rows (`kvbench size` writes them when there are not too many, "
                "or with --requests)"
            )
        try:
            with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
                head = f.readline(sizing.REQUEST_LINE_MAX + 1)
                if len(head) > sizing.REQUEST_LINE_MAX:
                    raise ValueError(f"a line longer than {sizing.REQUEST_LINE_MAX:,} characters")
                names = next(csv.reader([head]), [])
                # times float, counts int, whatever a batch holds (a batch of zeros reads as ints)
                types = {c: "float64" if c.endswith("_s") else "int64" for c in names}
                rows = sizing.BoundedLines(f, sizing.REQUEST_LINE_MAX)
                for chunk in pd.read_csv(rows, chunksize=BATCH_RECORDS, dtype=types, names=names, header=None):
                    # a sweep stopped while it wrote a configuration's rows: those are not its
                    chunk = chunk[chunk["configuration"].isin(sized)] if "configuration" in chunk else chunk
                    chunk.insert(0, "simulated", True)
                    chunk.insert(0, "folder", str(folder))
                    chunk.insert(0, "sizing", s.doc.get("name"))
                    yield chunk
        except (OSError, EOFError, ValueError, UnicodeDecodeError) as e:  # cut short or damaged
            raise InputError(f"{path}: unreadable: {type(e).__name__}: {e}") from None


# A text cell that starts with one of these is a formula to a spreadsheet (OWASP's CSV injection)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def to_csv(frame: pd.DataFrame, header: bool = True) -> str:
    """CSV, with list cells (a request's `itl_s`) as JSON text: one cell each. A text cell that a
    spreadsheet would take for a formula (an error text a server wrote, say) gets a leading
    apostrophe, as OWASP advises, so that it is shown, never evaluated; numbers are left alone."""
    out = frame.copy()
    for col in out.columns:
        if out[col].map(lambda v: isinstance(v, list)).any():
            out[col] = out[col].map(json.dumps)
        if out[col].dtype.kind not in "biufcmM":  # text (object or a string dtype), not numbers or times
            out[col] = out[col].map(lambda v: "'" + v if isinstance(v, str) and v.startswith(FORMULA_STARTS) else v)
    return str(out.to_csv(index=False, header=header))


def to_jsonl(frame: pd.DataFrame) -> str:
    text = str(frame.to_json(orient="records", lines=True))
    return text if text.endswith("\n") else text + "\n"


def _need_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError(
            "--format parquet needs pyarrow: pip install 'kvbench[parquet]' (or use --format csv or jsonl)"
        ) from None


class ParquetBatches:
    """One Parquet file written a batch at a time (a row group each), its schema the first
    batch's, with list columns (`itl_s`) typed as lists of floats whatever that batch held."""

    def __init__(self, path: Path, first: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.Schema.from_pandas(first, preserve_index=False)
        for i, name in enumerate(schema.names):
            if first[name].dtype == object and first[name].map(lambda v: isinstance(v, list)).any():
                schema = schema.set(i, pa.field(name, pa.list_(pa.float64())))
        self.schema = schema
        self.writer = pq.ParquetWriter(path, schema)

    def write(self, frame: pd.DataFrame) -> None:
        import pyarrow as pa

        self.writer.write_table(pa.Table.from_pandas(frame, schema=self.schema, preserve_index=False))

    def close(self) -> None:
        self.writer.close()
