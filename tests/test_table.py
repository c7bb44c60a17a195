"""A run's records as columns (harness/results/table.py): read back exactly as the record objects
are, damaged lines named with the same words, and every figure of the statistics core equal to
the same figure worked out record by record (the definitions in stats.py's docstring)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.analysis import findings, stats
from harness.gate import figures
from harness.results import RequestRecord, Table, load_runs, read_requests, read_table
from harness.results import table as table_module

GOLDEN = Path(__file__).parent / "golden" / "runs"
TIMES = st.one_of(st.none(), st.floats(0.0, 50.0))
COUNTS = st.one_of(st.none(), st.integers(0, 140_000))


@st.composite
def lines(draw: st.DrawFn) -> dict[str, Any]:
    """A record's line as kvbench writes one, with every optional field present or not."""
    ok = draw(st.booleans())
    d: dict[str, Any] = {
        "id": draw(st.integers(0, 2**40)),
        "arm": draw(st.sampled_from(["cached", "recompute"])),
        "phase": draw(st.sampled_from(["cold", "warm", "run", "warmup"])),
        "prompt_id": draw(st.sampled_from(["p1", "p2", "p3"])),
        "target_tokens": draw(st.one_of(st.none(), st.sampled_from([1000, 2000, 130_000]))),
        "prompt_tokens": draw(COUNTS),
        "cached_tokens": draw(COUNTS),
        "completion_tokens": draw(st.one_of(st.none(), st.integers(0, 40))),
        "start_s": draw(st.floats(0.0, 100.0)),
        "ttft_s": draw(TIMES),
        "first_byte_s": draw(TIMES),
        "first_content_s": draw(TIMES),
        "headers_s": draw(TIMES),
        "e2e_s": draw(TIMES),
        "itl_s": draw(st.lists(st.floats(0.0, 1.0), max_size=4)),
        "ok": ok,
        "error": None if ok else draw(st.sampled_from(["HTTP 500", "reset"])),
        "error_kind": None if ok else "http",
        "http_status": draw(st.one_of(st.none(), st.just(200))),
        "retried": draw(st.booleans()),
    }
    optional = {
        "worker": st.integers(0, 300),
        "process": st.integers(0, 3),
        "intended_s": st.floats(0.0, 100.0),
        "held_s": st.sampled_from([0.0, 0.5]),
        "session": st.integers(0, 5),
        "turn": st.integers(1, 4),
        "idle_s": st.floats(0.0, 400.0),
        "restore_bytes": st.integers(0, 2**40),
        "restore_tokens": st.integers(0, 130_000),
        "restore_s": st.floats(0.0, 2.0),
        "first_token_stamp": st.sampled_from(["kernel", "user"]),
        "first_token_late_s": st.floats(0.0, 0.01),
        "first_token_shared": st.integers(0, 3),
        "emulator_late_s": st.floats(0.0, 0.5),
        "request_id": st.text(max_size=8),
        "kind_fields": st.dictionaries(st.sampled_from(["rung", "note"]), st.integers(0, 9), max_size=2),
    }
    for name, values in optional.items():
        if draw(st.booleans()):
            d[name] = draw(values)
    return d


DAMAGE = [
    b"not json\n",
    b"[1, 2]\n",
    b'{"id": 1}\n',
    b'{"id": true, "arm": "a", "phase": "run", "prompt_id": "p", "start_s": 0}\n',
]


def _damaged(d: dict[str, Any], how: int) -> bytes:
    """A line of a record made wrong in one of the ways a reader must refuse."""
    wrong: list[dict[str, Any]] = [
        {"prompt_tokens": True},
        {"target_tokens": 2**64},
        {"itl_s": [0.1, "x"]},
        {"kind_fields": [1]},
        {"ttft_s": "fast"},
    ]
    return json.dumps({**d, **wrong[how]}).encode() + b"\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(lines(), max_size=40),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 8)), max_size=6),
    st.integers(1, 7),
    st.booleans(),
)
def test_a_table_reads_back_what_the_record_reader_reads(
    tmp_path: Path,
    records: list[dict[str, Any]],
    damage: list[tuple[int, int]],
    batch: int,
    cut: bool,
) -> None:
    """Any mix of records, damaged lines and a last line cut short, in batches of any size: the
    table's records, its lines left out and the words for them are read_requests' own."""
    out = [json.dumps(d).encode() + b"\n" for d in records]
    for at, how in damage:
        base = records[at % len(records)] if records else {"id": 1}
        bad = DAMAGE[how] if how < len(DAMAGE) else _damaged(base, how - len(DAMAGE))
        out.insert(min(at, len(out)), bad)
    text = b"".join(out)
    if cut and text:
        text = text[:-1][: max(1, len(text) - 5)]
    file = tmp_path / "requests.jsonl"
    file.write_bytes(text)
    for itl in (True, False):
        expected: list[str] = []
        got: list[str] = []
        want = read_requests(file, itl, expected)
        table = read_table(file, itl, got, batch_lines=batch)
        assert list(table) == want
        assert got == expected
        assert [table[i] for i in range(-len(want), len(want))] == want + want
        for name in table_module.HELD_NUMBERS:
            column = [getattr(r, name) for r in want]
            assert np.array_equal(table.numbers(name), np.asarray(column, dtype=float), equal_nan=True), name
        for name in table_module.HELD_TEXTS:
            codes, labels = table.codes(name)
            assert [labels[c] for c in codes] == [getattr(r, name) for r in want]
        assert table.ok.tolist() == [r.ok for r in want]
        assert stats.gaps(table).tolist() == [g for r in want if itl for g in r.itl_s]


def test_many_distinct_texts_are_read_back_per_record(tmp_path: Path) -> None:
    """A text field with more distinct values than TEXT_VALUES_MAX is not held as codes, and is
    still given back (read from each record's line)."""
    base = {"id": 1, "arm": "a", "prompt_id": "p", "start_s": 0.0, "ok": True}
    file = tmp_path / "requests.jsonl"
    file.write_text("".join(json.dumps({**base, "phase": f"p{k}"}) + "\n" for k in range(7)))
    table = read_table(file, batch_lines=2, text_values_max=3)
    assert "phase" not in table.columns.texts and "arm" in table.columns.texts
    codes, labels = table.codes("phase")
    assert [labels[c] for c in codes] == [f"p{k}" for k in range(7)]
    assert table.text_is("phase", "p4").tolist() == [k == 4 for k in range(7)]


def test_a_closed_loop_record_takes_under_60_bytes() -> None:
    """What a 10^7-record reader holds per record (results/table.py): the shipped closed loop's
    columns and line offsets, counted in bytes (a column no record fills takes none)."""
    t = read_table(next((GOLDEN / "golden-loop").iterdir()) / "requests.jsonl")
    c = t.columns
    assert isinstance(c.source, table_module.Lines)
    held = [*c.numbers.values(), *c.missing.values(), *(codes for codes, _ in c.texts.values()), *c.flags.values()]
    held += [c.gaps, c.source.offsets]
    per_record = sum(a.itemsize if a.strides == (0,) else a.nbytes for a in held) / len(t)
    assert per_record < 60, per_record


# The figures worked out record by record: the statistics core's definitions, one request at a time


def _values(records: list[RequestRecord], metric: str) -> list[float]:
    done = [r for r in records if r.ok]
    if metric == "itl_s":
        return [g for r in done for g in r.itl_s]
    if metric in stats.WITH_RESTORE:
        got = [None if (v := getattr(r, metric)) is None else v + (r.restore_s or 0.0) for r in done]
    else:
        got = [getattr(r, "ttft_s" if metric == "request_ttft_s" else metric) for r in done]
    return [v for v in got if v is not None]


def _meets(r: RequestRecord, slo: dict[str, float]) -> bool:
    if not r.ok:
        return False
    for metric, limit in slo.items():
        v = getattr(r, metric)
        if v is None and metric == "tpot_s":
            continue
        if v is None or v > limit:
            return False
    return True


def _mean_concurrency(records: list[RequestRecord]) -> float | None:
    begin = [r.start_s - (r.restore_s or 0.0) for r in records]
    events = sorted([(b, 1) for b in begin] + [(e, -1) for r in records if (e := r.end_s()) is not None])
    done = [r for r in records if r.ok]
    span = max(r.start_s + (r.e2e_s or 0.0) for r in done) - min(begin)
    level, area, prev = 0, 0.0, min(begin)
    for t, d in events:
        area += level * (t - prev)
        level += d
        prev = t
    return area / span if span > 0 else None


def _schedule_lag(records: list[RequestRecord]) -> dict[str, Any]:
    timed = sorted((r for r in records if r.intended_s is not None), key=lambda r: r.intended_s or 0.0)
    lag = [r.start_s - (r.intended_s or 0.0) for r in timed]
    held = [r.held_s for r in timed if r.held_s]
    return {
        "requests": len(timed),
        "p50_s": stats.percentile(lag, 50),
        "max_s": max(lag) if lag else None,
        "held_back": len(held),
    }


@settings(max_examples=60, deadline=None)
@given(st.lists(lines(), max_size=30), st.floats(0.01, 40.0))
def test_every_figure_is_the_one_worked_out_record_by_record(raw: list[dict[str, Any]], limit: float) -> None:
    """The statistics core over columns against its definitions applied one record at a time."""
    records = [RequestRecord.from_json(d) for d in raw]
    t = Table.of(records)
    for metric in stats.PER_REQUEST:
        if metric != "tpot_s":
            assert stats.values(t, metric).tolist() == _values(records, metric), metric
    tpot = [v for r in records if r.ok and (v := r.tpot_s) is not None]
    assert stats.values(t, "tpot_s").tolist() == pytest.approx(tpot)
    slo = {"ttft_s": limit, "tpot_s": limit / 10}
    kept = [r for r in records if r.phase != "warmup"]
    assert stats.goodput(t, slo)["met"] == sum(_meets(r, slo) for r in kept)
    through = stats.throughput(t)
    assert through.completed == sum(r.ok for r in records)
    if through.completed:
        expected = _mean_concurrency(records)
        assert through.mean_concurrency == (pytest.approx(expected) if expected is not None else None)
    lag = stats.schedule_lag(t)
    assert {k: lag[k] for k in ("requests", "p50_s", "max_s", "held_back")} == _schedule_lag(records)
    both = [(r.cached_tokens, r.prompt_tokens) for r in records if r.ok and r.cached_tokens is not None]
    total = sum(p for c, p in both if p)
    share = stats.cached_share(t)
    assert share == (pytest.approx(sum(c for c, p in both if p) / total) if total else None)
    for by in (("phase", "target_tokens"), ("arm",), ("turn",), ("worker", "first_token_stamp")):
        expected_groups: dict[tuple[Any, ...], list[RequestRecord]] = {}
        for r in records:
            expected_groups.setdefault(tuple(getattr(r, k) for k in by), []).append(r)
        for few, counted in ((stats.FEW_GROUPS, stats.COUNTED_MAX), (0, 1)):  # counted, and sorted
            got = {k: list(g) for k, g in stats.groups(t, by, counted=counted, few=few).items()}
            assert got == expected_groups
            assert list(got) == sorted(expected_groups, key=lambda k: tuple((v is None, v) for v in k))
    reads = stats.first_token_reads(t)
    kernel = [r for r in records if r.ttft_s is not None and r.first_token_stamp == "kernel"]
    kernel = [r for r in kernel if r.first_token_late_s is not None]
    assert (reads["kernel"], reads["shared_reads"]) == (len(kernel), sum(bool(r.first_token_shared) for r in kernel))
    rows = findings.group_stats(t)
    assert sum(row["count"] for row in rows) == len(records)
    assert sum(row["errors"] for row in rows) == sum(not r.ok for r in records)


def test_gaps_beyond_the_bound_are_every_kth_records() -> None:
    """ITL over more than GAPS_HELD gaps: those of every k-th record, k the smallest that keeps
    them within the bound, and gaps_every says k."""
    base = {"id": 1, "arm": "a", "phase": "run", "prompt_id": "p", "start_s": 0.0, "ok": True}
    records = [RequestRecord.from_json({**base, "itl_s": [k + 0.25, k + 0.5]}) for k in range(12)]
    assert stats.gaps_every(records, 10) == math.ceil(24 / 10)
    assert stats.gaps(records, held=10).tolist() == [g for k in range(0, 12, 3) for g in (k + 0.25, k + 0.5)]
    assert stats.gaps_every(records[:5], 10) == 1 and stats.gaps_every(records) == 1


def test_the_gate_bounds_a_runs_gaps_and_says_so() -> None:
    """The gate pools a run's ITL over its groups: beyond GAPS_HELD gaps in the run, every k-th
    request's of each group, and a note names the run and k."""
    run = load_runs([GOLDEN / "golden-loop"])[0]
    fig = figures.of_runs([run], ["itl_s"], gaps_held=100)
    every = math.ceil(int(stats.ok(run.records).gap_counts.sum()) / 100)
    assert every > 1 and fig.notes == [
        f"{run.label}: itl_s from the token gaps of 1 request in {every} (the run has more than 100 gaps)"
    ]
    pooled = np.concatenate([v["itl_s"] for v in fig.samples.values()])
    expected = [
        g
        for _, group in stats.groups(run.records, ("phase", "target_tokens")).items()
        for g in stats.gaps(group, every)
    ]
    assert sorted(pooled.tolist()) == sorted(expected) and len(pooled) < int(run.records.gap_counts.sum())


def test_a_group_of_many_gaps_says_its_itl_is_one_request_in_k() -> None:
    """The report's group rows: beyond `gaps_held` gaps in a group, its ITL figures are those of
    one request in k, and the row says k (the report writes "1 in k" beside them)."""
    run = load_runs([GOLDEN / "golden-loop"])[0]
    whole, sampled = findings.group_stats(run.records), findings.group_stats(run.records, gaps_held=20)
    for a, b, (_, group) in zip(
        whole, sampled, stats.groups(run.records, ("arm", "phase", "target_tokens")).items(), strict=True
    ):
        n = int(stats.ok(group).gap_counts.sum())
        assert a["itl_every"] == 1 and b["itl_every"] == max(1, math.ceil(n / 20))
        assert b["itl_s_p50"] == stats.describe(stats.gaps(group, b["itl_every"]))["p50"]
    assert any(b["itl_every"] > 1 for b in sampled)
