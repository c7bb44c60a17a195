"""Results as DataFrames (`harness.load`) and on disk (`kvbench export`): the same figures as
run.json, the report and the gate; exports that read back equal; damaged lines skipped and
counted; pandas never loaded on the run path."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness import load
from harness.analysis import frames, stats
from harness.commands.export import to_csv, write_table
from harness.gate import figures
from harness.results import load_runs
from tests.conftest import ROOT, cli, kind_table

GOLDEN = Path(__file__).parent / "golden" / "runs"


def test_per_arm_figures_equal_run_json_the_report_and_the_gate() -> None:
    runs = load(GOLDEN / "golden-loop")
    summary = runs.summary().set_index("arm")
    report = {
        label.split("/")[1]: row
        for label, row in kind_table(load_runs([GOLDEN / "golden-loop"]), "Throughput (closed loop)").items()
    }
    gate = figures.of_runs(load_runs([GOLDEN / "golden-loop"])).run_values
    for run in runs.runs:
        row, s = summary.loc[run.arm], run.meta["summary"]
        assert row["completed"] == s["completed"] and row["req_per_s"] == s["req_per_s"]
        for q in ("p50", "p90", "p99"):
            assert row[f"ttft_s_{q}"] == s["ttft_s"][q] == report[run.arm][f"TTFT {q} (s)"]
        assert row["req_per_s"] == report[run.arm]["req/s"] == gate[(run.arm, "req_per_s", None, None)][0]


def test_one_row_per_request_with_its_run() -> None:
    runs = load([GOLDEN / "smoke", str(GOLDEN / "golden-loop")])
    frame = runs.requests()
    assert len(frame) == sum(len(r.records) for r in runs.runs)
    assert {"run_id", "scenario", "arm", "kind", "ttft_s", "request_ttft_s", "cached_tokens", "itl_s"} <= set(frame)
    first = runs.runs[0].records[0]
    row = frame.iloc[0]
    assert row["ttft_s"] == first.ttft_s and row["arm"] == first.arm and row["itl_s"] == first.itl_s
    by_length = runs.by_length()
    sweep = next(r for r in runs.runs if r.kind == "sweep")
    assert by_length["speedup"].tolist()[: len(stats.sweep_rows(sweep.records))] == [
        r["speedup"] for r in stats.sweep_rows(sweep.records)
    ]


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_exports_read_back_equal_the_frame(fmt: str, tmp_path: Path) -> None:
    out = tmp_path / f"requests.{fmt}"
    r = cli("export", str(GOLDEN / "golden-loop"), "--format", fmt, "-o", str(out))
    assert r.returncode == 0, r.stderr
    frame = load(GOLDEN / "golden-loop").requests()
    if fmt == "csv":
        back = pd.read_csv(out, engine="python")  # (the C parser may round the last bit of a float)
        back["itl_s"] = back["itl_s"].map(json.loads)
        assert out.read_text() == to_csv(frame)
    elif fmt == "parquet":
        back = pd.read_parquet(out)
        back["itl_s"] = back["itl_s"].map(list)
    else:
        back = pd.read_json(out, lines=True, precise_float=True)
    for col in ("id", "arm", "ttft_s", "e2e_s", "ok", "cached_tokens", "itl_s"):
        assert back[col].tolist() == frame[col].tolist(), col


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
def test_a_table_streamed_in_batches_is_the_table_whatever_the_batch(fmt: str, tmp_path: Path) -> None:
    """`export --table requests` streams records in batches (a day-long run in bounded memory):
    any batch size writes the same file as one batch of all, down to a first batch with no gaps
    (itl_s empty) or no server count (<NA>) that a later batch has."""
    folder = tmp_path / "run"
    shutil.copytree(GOLDEN / "golden-loop" / "20261130T220228Z-cached", folder)
    lines = (folder / "requests.jsonl").read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    first.update(itl_s=[], prompt_tokens=None, cached_tokens=None)  # (what a later line has, a first lacks)
    (folder / "requests.jsonl").write_bytes(json.dumps(first).encode() + b"\n" + b"".join(lines[1:]))
    whole = load(folder).requests()
    got = []
    for size in (1, 7, 10_000):
        runs = frames.load_meta(folder)
        assert not runs.runs[0].records  # read back without its records: they are streamed
        out = tmp_path / f"{size}.{fmt}"
        write_table(frames.request_batches(runs.runs, size), fmt, out, "no rows")
        got.append(out.read_bytes() if fmt != "parquet" else pd.read_parquet(out))
    if fmt == "parquet":
        for back in got:
            back["itl_s"] = back["itl_s"].map(list)
            pd.testing.assert_frame_equal(back, got[-1])
        assert back["itl_s"].tolist() == whole["itl_s"].tolist() and back["prompt_tokens"].isna().tolist()[0]
    else:
        assert got[0] == got[1] == got[2]
        assert len(got[0].splitlines()) == len(whole) + (fmt == "csv")


def test_damaged_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    run = next((GOLDEN / "smoke").iterdir())
    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    with (copy / "requests.jsonl").open("a") as f:
        f.write('{"id": "cut sh')
    runs = load(copy)
    assert len(runs.requests()) == len(load(run).requests()) and len(runs.skipped) == 1
    r = cli("export", str(copy), "--format", "jsonl")
    assert r.returncode == 0 and "requests.jsonl:" in r.stderr and len(r.stdout.splitlines()) == len(runs.requests())


def test_parquet_without_a_file_and_bad_formats_are_clear_errors() -> None:
    for args in (("--format", "parquet"), ("--format", "xlsx"), ("--table", "nope")):
        r = cli("export", str(GOLDEN / "smoke"), *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr


def test_the_run_path_never_loads_pandas() -> None:
    code = "import sys, harness.cli, harness.runner, harness.commands.run; print('pandas' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_csv_cells_a_spreadsheet_would_evaluate_are_neutralised() -> None:
    """Text from a server (an error message) that starts like a formula gets a leading apostrophe
    (OWASP's CSV-injection advice); numbers, negative ones included, are written as they are."""
    frame = pd.DataFrame(
        {"error": ['=HYPERLINK("http://x","y")', "+1", "-cmd", "@SUM(A1)", "ok", None], "ttft_s": [-1.5, 0, 1, 2, 3, 4]}
    )
    back = pd.read_csv(io.StringIO(to_csv(frame)), keep_default_na=False)
    assert back["error"].tolist() == ['\'=HYPERLINK("http://x","y")', "'+1", "'-cmd", "'@SUM(A1)", "ok", ""]
    assert back["ttft_s"].tolist() == [-1.5, 0, 1, 2, 3, 4]


def test_an_output_never_follows_a_link_planted_where_its_temporary_file_was(tmp_path: Path) -> None:
    """Every -o output is written to a fresh, unpredictable temporary name beside it and renamed:
    links planted at the names used before (`<out>.tmp`) are left alone, with their targets, and
    no temporary file stays behind."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for fmt in ("csv", "parquet"):
        out = tmp_path / f"requests.{fmt}"
        (tmp_path / f"requests.{fmt}.tmp").symlink_to(victim)
        r = cli("export", str(GOLDEN / "golden-loop"), "--format", fmt, "-o", str(out))
        assert r.returncode == 0, r.stderr
        assert out.is_file() and not out.is_symlink()
    assert victim.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim.txt", "requests.csv", "requests.csv.tmp", "requests.parquet", "requests.parquet.tmp"]
    )


def test_a_table_with_no_rows_is_a_clear_error_not_an_empty_file(tmp_path: Path) -> None:
    """`--table by_length` of runs that sweep no lengths (a closed loop): exit 2, saying why, and
    no file written."""
    out = tmp_path / "by_length.csv"
    r = cli("export", str(GOLDEN / "golden-loop"), "--table", "by_length", "-o", str(out))
    assert r.returncode == 2 and "by_length" in r.stderr and "sweep" in r.stderr, r.stderr
    assert not out.exists()


def test_the_summary_frame_has_the_schedule_lag_where_requests_had_send_times(tmp_path: Path) -> None:
    """An open loop's (or a timed trace's) records carry their intended send time: the summary
    frame gives the schedule's lag and the load offered against the load sent, as run.json's
    summary does (load().summary() left them out: issue 56 item 16); runs without send times
    have no such columns."""
    folder = tmp_path / "golden-loop" / "x-cached"
    shutil.copytree(next((GOLDEN / "golden-loop").glob("*-cached")), folder)
    lines = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    for k, r in enumerate(lines):
        r["intended_s"] = r["start_s"] - 0.001 * (k % 3)  # sent 0, 1 or 2 ms late
    (folder / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (row,) = load(folder).summary().to_dict("records")
    lag = stats.schedule_lag(stats.measured(load_runs([folder])[0].records))
    assert row["schedule_lag_p99_s"] == lag["p99_s"] and row["schedule_lag_max_s"] == pytest.approx(0.002)
    assert row["schedule_lag_sent_req_per_s"] == lag["sent_req_per_s"] is not None
    assert not any(c.startswith("schedule_lag") for c in load(GOLDEN / "golden-loop").summary())
