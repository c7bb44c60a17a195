"""HTML reports: rendered for every kind of run, escaped, self-contained, and checked in a real
browser (Debian's chromium, driven over the DevTools protocol)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from harness.report.build import render
from harness.results import load_runs
from tests.browser import assert_clean, inspect_page
from tests.conftest import cli, kvbench, write_scenario

CLOSED = """
name = "redbooks-concurrency"
[endpoint]
max_tokens = 8
[workload]
kind = "closed_loop"
requests = 40
concurrency = 8
pool = 10
prompt_tokens = 2000
[[arms]]
name = "recompute"
cache = "bust"
[[arms]]
name = "cached"
[emulator]
time_scale = 20.0
[reference]
test = "concurrency"
"""
SWEEP = """
name = "redbooks-ttft-sweep"
[endpoint]
max_tokens = 2
[workload]
kind = "sweep"
lengths = [2000, 8000, 16000]
repetitions = 2
[emulator]
time_scale = 20.0
[reference]
test = "ttft"
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("results")
    for name, body in (("sweep", SWEEP), ("closed", CLOSED)):
        r = kvbench("run", str(write_scenario(tmp / f"{name}.toml", body)), "--out", str(tmp / "out"))
        assert r.returncode == 0, r.stderr
    return tmp / "out"


def edited_copy(src: Path, dst: Path, meta: dict[str, Any], records: list[dict[str, Any]] | None = None) -> Path:
    shutil.copytree(src, dst)
    m = json.loads((dst / "run.json").read_text())
    m.update(meta)
    (dst / "run.json").write_text(json.dumps(m))
    if records is not None:
        (dst / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return dst


def one_run(results: Path, scenario: str) -> Path:
    return sorted((results / scenario).iterdir())[0]


def test_sweep_and_two_arm_closed_loop_render(results: Path, tmp_path: Path) -> None:
    out = render(load_runs([results / "redbooks-ttft-sweep", results / "redbooks-concurrency"]), tmp_path / "r.html")
    html = out.read_text()
    assert "TTFT vs prompt length" in html and "Throughput (closed loop)" in html and "Claims audit" in html
    assert html.count("<svg") >= 6
    assert "Emulated results" in html
    assert "32.14" in html and "4.26" in html  # published figures beside the measured
    assert "published 18%" in html  # the flagged claim
    assert not re.search(r"(src|href)\s*=\s*[\"'](https?:)?//", html)
    assert "<script" not in html.lower()
    assert len(html) < 5_000_000


def test_the_claims_audit_is_only_for_runs_of_a_published_test(results: Path, tmp_path: Path) -> None:
    src = one_run(results, "redbooks-concurrency")
    scenario = {k: v for k, v in json.loads((src / "run.json").read_text())["scenario"].items() if k != "reference"}
    plain = edited_copy(src, tmp_path / "plain", {"scenario": scenario})
    assert "Claims audit" not in render(load_runs([plain]), tmp_path / "plain.html").read_text()
    assert "Claims audit" in render(load_runs([src]), tmp_path / "paper.html").read_text()


def test_an_arm_slower_than_recomputing_is_said_plainly(results: Path, tmp_path: Path) -> None:
    # the cached arm's first tokens set far below and far above the recompute arm's (an emulator
    # on a busy machine may put them anywhere: the records say which, not the host)
    folders = sorted((results / "redbooks-concurrency").iterdir())
    cached = next(f for f in folders if f.name.endswith("-cached"))
    others = [f for f in folders if f != cached]
    lines = (cached / "requests.jsonl").read_text().splitlines()
    for ttft, said in ((0.001, False), (60.0, True)):
        edited = edited_copy(
            cached, tmp_path / str(ttft) / cached.name, {}, [{**json.loads(x), "ttft_s": ttft} for x in lines]
        )
        html = render(load_runs([*others, edited]), tmp_path / f"{ttft}.html").read_text()
        assert ("redbooks-concurrency/cached was slower than recomputing: TTFT p50 60 s against" in html) is said
        assert ("slower than recomputing" in html) is said


def test_errors_interrupted_single_request_and_escaping(results: Path, tmp_path: Path) -> None:
    src = one_run(results, "redbooks-ttft-sweep")
    recs = [json.loads(line) for line in (src / "requests.jsonl").read_text().splitlines()]
    evil = "<script>alert('x')</script>"
    bad = dict(recs[0], ok=False, error=f"HTTP 500: {evil}", ttft_s=None, http_status=500)
    errors = edited_copy(src, tmp_path / "a" / "s" / "errors", {"model": evil, "warnings": [evil]}, [*recs, bad])
    partial = edited_copy(src, tmp_path / "b" / "s" / "partial", {"status": "interrupted"}, recs[:3])
    single = edited_copy(src, tmp_path / "c" / "s" / "single", {}, recs[:1])
    empty = edited_copy(src, tmp_path / "d" / "s" / "empty", {"status": "running"}, [])
    for folders in ([errors], [partial], [single], [empty], [errors, partial, single, empty]):
        html = render(load_runs(folders), tmp_path / "r.html").read_text()
        assert evil not in html and "<script" not in html.lower()
    html = render(load_runs([errors, partial]), tmp_path / "r.html").read_text()
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    assert "Partial results" in html and "interrupted" in html


def test_cli_report_and_run_report(results: Path, tmp_path: Path) -> None:
    r = cli("report", str(results / "redbooks-ttft-sweep"), "-o", str(tmp_path / "x.html"))
    assert r.returncode == 0 and Path(r.stdout.strip()) == tmp_path / "x.html"
    r = cli("report", str(tmp_path / "nothing-here"))
    assert r.returncode == 2 and "no such result folder" in r.stderr
    r = cli("compare", str(results / "redbooks-ttft-sweep"), str(results / "redbooks-ttft-sweep"))
    assert r.returncode == 0 and "within noise" in r.stdout


# --- a real browser ------------------------------------------------------------------------


def test_report_in_a_real_browser(results: Path, tmp_path: Path, browser: str) -> None:
    page = render(load_runs([results / "redbooks-ttft-sweep", results / "redbooks-concurrency"]), tmp_path / "r.html")
    got = asyncio.run(inspect_page(browser, page.as_uri()))
    assert_clean(got, page)
    assert len(got["sizes"]) >= 6 and all(w > 200 and h > 100 for w, h in got["sizes"])
    (tmp_path / "report.png").write_bytes(got["png"])
    assert got["png"][:8] == b"\x89PNG\r\n\x1a\n" and len(got["png"]) > 50_000


NEW_KINDS = {
    "open": """
name = "open"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
rates = [4.0, 12.0]
requests = 24
pool = 4
prompt_tokens = 1000
[slo]
ttft_s = 0.5
[[arms]]
name = "recompute"
cache = "bust"
[[arms]]
name = "cached"
[emulator]
time_scale = 10.0
""",
    "sess": """
name = "sess"
[workload]
kind = "sessions"
users = 3
turns = 3
think_s = 2.0
user_context_tokens = 2000
message_tokens = 50
answer_tokens = 10
[emulator]
profile = "tiered"
time_scale = 10.0
""",
    "trace": """
name = "trace"
[workload]
kind = "trace"
path = "scenarios/traces/mooncake-sample.jsonl"
max_requests = 30
speed = 10.0
lru_blocks = [40]
[emulator]
time_scale = 10.0
""",
}


@pytest.fixture(scope="module")
def new_kinds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("kinds")
    for name, body in NEW_KINDS.items():
        r = kvbench("run", str(write_scenario(tmp / f"{name}.toml", body)), "--out", str(tmp / "out"))
        assert r.returncode == 0, r.stderr
    return tmp / "out"


def test_open_loop_sessions_and_trace_sections_in_a_real_browser(new_kinds: Path, tmp_path: Path, browser: str) -> None:
    page = render(load_runs([new_kinds / n for n in NEW_KINDS]), tmp_path / "r.html")
    html = page.read_text()
    for title in (
        "Open loop: latency, goodput",
        "Multi-turn sessions",
        "Trace replay: the reuse captured",
        "an LRU cache of 40 blocks",
    ):
        assert title in html
    got = asyncio.run(inspect_page(browser, page.as_uri()))
    assert_clean(got, page)
    # two open-loop curves and three sessions plots, each drawn at a readable size
    assert len(got["sizes"]) >= 5 and all(w > 200 and h > 100 for w, h in got["sizes"])


def test_a_timeline_of_many_requests_draws_one_in_k_and_says_so(tmp_path: Path) -> None:
    """A run with more requests than a timeline can show a line each (sections.TIMELINE_REQUESTS)
    draws every k-th, and its caption says one in k; a smaller run draws every request."""
    from dataclasses import replace

    from harness.report.sections import TIMELINE_REQUESTS, timelines

    (run, *_) = load_runs([Path(__file__).parent / "golden" / "runs" / "golden-loop"])
    many = [replace(run.records[i % len(run.records)], id=i + 1) for i in range(2 * TIMELINE_REQUESTS + 1)]
    drawn = timelines([replace(run, records=many), run])["timelines"]
    assert [(t["n"], t["every"]) for t in drawn] == [(len(many), 3), (len(run.records), 1)]
    render([replace(run, records=many)], tmp_path / "many.html")
    render([run], tmp_path / "few.html")
    assert f"{len(many)} requests, one in 3 drawn" in (tmp_path / "many.html").read_text()
    assert "drawn" not in (tmp_path / "few.html").read_text()
