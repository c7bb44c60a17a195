"""Open loops: arrival schedules, SLOs and goodput, capacity, schedule lag, against the real
emulator on an ephemeral port (and llama.cpp in test_llamacpp.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import math
import types
import weakref
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from harness.analysis import capacity, stats
from harness.analysis.capacity import Point
from harness.config import scenario
from harness.config.kinds import schedule
from harness.config.kinds.open_loop import OpenLoopConfig
from harness.core import aio
from harness.core.errors import InputError
from harness.results import read_requests, read_run
from harness.workloads import closed_loop, open_loop
from harness.workloads.base import Plan, Timed
from tests.conftest import cli, kvbench, write_scenario

BASE = """
name = "ol"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
pool = 4
prompt_tokens = 1000
"""


def workload(extra: str) -> OpenLoopConfig:
    w = parse(extra).workload
    assert isinstance(w, OpenLoopConfig)
    return w


def parse(extra: str, slo: str = "") -> scenario.Scenario:
    import tomllib

    return scenario.parse(tomllib.loads("schema_version = 1\n" + BASE + extra + slo), "x.toml")


@pytest.mark.parametrize(
    ("extra", "slo", "where"),
    [
        ("rate = 0\nrequests = 5", "", "workload.rate"),
        ("rate = -1.0\nrequests = 5", "", "workload.rate"),
        ("rate = nan\nrequests = 5", "", "workload.rate"),
        ("rate = inf\nrequests = 5", "", "workload.rate"),
        ("rates = []\nrequests = 5", "", "workload.rates"),
        ('rates = [1.0, "x"]\nrequests = 5', "", "workload.rates[1]"),
        ('rates = "sometimes"\nrequests = 5', "", "workload.rates"),
        ('rate = 1.0\nrequests = 5\narrivals = "gamma"\ngamma_shape = 0', "", "workload.gamma_shape"),
        ('rate = 1.0\nrequests = 5\narrivals = "gamma"\ngamma_shape = -2.0', "", "workload.gamma_shape"),
        ("rate = 1.0\nrequests = 5\ngamma_shape = 2.0", "", "workload.gamma_shape"),
        ("rate = 1.0\nrates = [2.0]\nrequests = 5", "", "workload"),
        ("rate = 1.0", "", "workload"),
        ("rate = 1.0\nrequests = 5", "\n[slo]\nttft_s = 1.0\nshare = 0", "slo.share"),
        ("rate = 1.0\nrequests = 5", "\n[slo]\nttft_s = 1.0\nshare = 1.5", "slo.share"),
        ("rate = 1.0\nrequests = 5", "\n[slo]\nshare = 0.9", "slo"),
        ("rate = 1.0\nrequests = 5", "\n[slo]\nttft_s = 0", "slo.ttft_s"),
        ("rate = 1.0\nrequests = 5", "\n[slo]\nttft = 1.0", "slo.ttft"),
        ("rate = 1.0\nrequests = 5\ncapacity_width = 0.1", "", "workload.capacity_width"),
        ("rates = [1.0, 2.0]\nrequests = 5\ncapacity_width = 0", "", "workload.capacity_width"),
        ("rates = [1.0, 2.0]\nrequests = 5\ncapacity_width = 1.5", "", "workload.capacity_width"),
        ('rates = "auto"\nrequests = 5\ncapacity_width = "10%"', "", "workload.capacity_width"),
        ("rates = [1.0, 2.0]\nrequests = 5\ncapacity_loads = 3", "", "workload.capacity_loads"),
        ("rates = [1.0, 2.0]\nrequests = 5\ncapacity_width = 0.1\ncapacity_loads = 0", "", "workload.capacity_loads"),
    ],
)
def test_bad_open_loop_input_names_the_key(extra: str, slo: str, where: str) -> None:
    with pytest.raises(InputError) as e:
        parse(extra, slo)
    assert f"x.toml: {where}" in str(e.value)


def test_more_workers_than_max_concurrency_is_refused(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "s.toml", BASE + "rate = 3.0\nrequests = 5\nmax_concurrency = 1\n")
    r = kvbench("run", str(sc), "--workers", "2", "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "max_concurrency = 1" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("shares", [False, True])
def test_warmup_prompts_share_no_prefix_with_measured_ones_unless_asked(tmp_path: Path, shares: bool) -> None:
    extra = "rate = 4.0\nrequests = 3\nwarmup_requests = 3\n" + ("warmup_shares_prefixes = true\n" if shares else "")
    sc = write_scenario(
        tmp_path / "w.toml", BASE.replace("pool = 4", "pool = 1") + extra + "[emulator]\ntime_scale = 10.0\n"
    )
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    (folder,) = (p for p in (tmp_path / "out" / "ol").iterdir() if p.is_dir())
    recs = read_requests(folder)
    hits = {phase: [(x.cached_tokens or 0) > 500 for x in recs if x.phase == phase] for phase in ("warmup", "run")}
    # the warm-up finds its own KV after the first of it the server takes (which one that is, on a
    # busy host, is the server's order, not the schedule's); the first measured request finds the
    # warm-up's only when the scenario says the warm-up shares the measured prefixes
    assert len(hits["warmup"]) == len(hits["run"]) == 3
    assert hits["warmup"].count(False) == 1
    assert hits["run"].count(False) == (0 if shares else 1)


def test_bad_rate_exits_2_from_the_cli(tmp_path: Path) -> None:
    sc = write_scenario(tmp_path / "s.toml", BASE + "rate = -3\nrequests = 5\n")
    r = cli("validate", str(sc))
    assert r.returncode == 2 and "workload.rate" in r.stderr and "Traceback" not in r.stderr


def test_poisson_and_gamma_schedules_have_the_asked_distribution() -> None:
    w = workload("rate = 50.0\nrequests = 4000")
    gaps = np.diff(schedule.send_times(w, 50.0, 7))
    assert sps.kstest(gaps, "expon", args=(0, 1 / 50.0)).pvalue > 0.01
    assert abs(gaps.mean() - 1 / 50.0) < 0.1 / 50.0
    for k in (0.25, 4.0):
        g = workload(f'rate = 50.0\nrequests = 4000\narrivals = "gamma"\ngamma_shape = {k}')
        gaps = np.diff(schedule.send_times(g, 50.0, 7))
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(k), rel=0.08)
    const = np.diff(schedule.send_times(workload('rate = 4.0\nrequests = 10\narrivals = "constant"'), 4.0, 1))
    assert np.allclose(const, 0.25)
    # reproducible for a seed, different for another, and duration_s bounds the measured part
    assert np.array_equal(schedule.send_times(w, 50.0, 7), schedule.send_times(w, 50.0, 7))
    assert not np.array_equal(schedule.send_times(w, 50.0, 7), schedule.send_times(w, 50.0, 8))
    d = workload("rate = 20.0\nduration_s = 10.0\nwarmup_requests = 3")
    t = schedule.send_times(d, 20.0, 1)
    assert 3 + 120 < len(t) < 3 + 280 and t[-1] - t[3] < 10.0


def _point(rate: float, met: int, n: int = 40, saturated: bool = False, achieved: float | None = None) -> Point:
    lo, hi = stats.share_ci(met, n)
    return Point(
        "rate", rate, achieved or rate, n, met, met / n, lo, hi, met / n * rate, 1, 1, 0.02, 0.02, 0, 0, saturated
    )


def test_capacity_interpolates_between_the_rates_around_the_crossing() -> None:
    pts = [_point(1, 40), _point(2, 38), _point(3, 20), _point(4, 4)]
    c = capacity.capacity(pts, 0.9)
    # share 0.95 at 2, 0.5 at 3: crosses 0.9 at 2 + 0.05 / 0.45
    assert c.bound == "measured" and c.req_per_s == pytest.approx(2 + 0.05 / 0.45)
    assert 2 <= c.low <= c.req_per_s <= c.high <= 3
    assert capacity.capacity(pts[:2], 0.9).bound == "at_least"
    assert capacity.capacity(pts[2:], 0.9).bound == "below"
    assert capacity.capacity(pts, None).bound == "no_slo"
    # a saturated rate fails whatever its share; the capacity is what it completed
    sat = capacity.capacity([_point(1, 40), _point(2, 40, saturated=True, achieved=1.7)], 0.9)
    assert (sat.req_per_s, sat.low, sat.high) == (1.7, 1, 2)


def test_a_capacity_is_never_above_the_arms_saturated_throughput() -> None:
    """kv-tier-capacity.toml at time scale 10: every rate up to 7.4 req/s met the SLO with 40
    requests each, though the arm saturated at 6.17 req/s: not "at least 7.4" but 6.17, said as
    the saturated throughput, with the probe's interval; an interpolated capacity above it is
    capped too, and one below it keeps its own interval, never reaching above the probe's."""
    probe = capacity.Ceiling(6.17, 5.8, 6.6, 64)
    held = [_point(2.0, 40), _point(5.0, 39), _point(7.4, 38, achieved=5.58)]
    c = capacity.capacity(held, 0.9, probe)
    assert (c.req_per_s, c.low, c.high, c.bound) == (6.17, 5.8, 6.6, "saturation")
    text = capacity.capacity_text(dataclasses.asdict(c))
    assert "saturated throughput" in text and "95 % interval 5.8 to 6.6" in text
    crossing = capacity.capacity([_point(5.0, 40), _point(8.0, 20)], 0.9, capacity.Ceiling(5.5, 5.0, 6.0, 64))
    assert (crossing.req_per_s, crossing.low, crossing.bound) == (5.5, 5.0, "saturation")
    assert crossing.high is not None and 5.5 < crossing.high < 6.0  # the SLO share says no more than 5.85
    assert capacity.capacity(held, 0.9, capacity.Ceiling(20.0, 18.0, 22.0, 64)).bound == "at_least"
    below = capacity.capacity([_point(2.0, 40), _point(6.0, 30)], 0.9, capacity.Ceiling(7.0, 6.5, 7.5, 64))
    assert below.bound == "measured" and below.req_per_s is not None and below.req_per_s < 6.0
    # a probe too irregular for an interval: said so, not a point
    bare = capacity.capacity(held, 0.9, capacity.Ceiling(6.17, None, None, 64))
    assert "no interval" in capacity.capacity_text(dataclasses.asdict(bare))


def test_with_the_probe_a_rates_saturation_verdict_does_not_decide_the_capacity() -> None:
    """kv-tier-capacity.toml, four runs: the cached arm's rate of 6.49 req/s was found saturated
    in two (its queue rose through 80 requests) and held in two; the capacity came out 6.2-6.3 or
    7.2 req/s, each with an interval that did not hold the others. The SLO held at every rate: with
    the saturated probe measured, the capacity is its throughput either way."""
    probe = capacity.Ceiling(7.16, 6.6, 7.7, 64)
    flagged = [_point(1.5, 40), _point(5.7, 40), _point(6.49, 80, 80, saturated=True, achieved=6.2)]
    flagged.append(_point(8.6, 39, saturated=True, achieved=7.0))
    clean = [*flagged[:2], _point(6.49, 80, 80), flagged[3]]
    assert capacity.capacity(flagged, 0.9, probe) == capacity.capacity(clean, 0.9, probe)
    assert capacity.capacity(flagged, 0.9, probe).req_per_s == 7.16
    # without the probe (rates listed), the first rate found saturated is where it stops
    assert capacity.capacity(flagged, 0.9).req_per_s == 6.2


def test_narrowing_a_capacity_measures_an_unsure_rate_again_else_one_between() -> None:
    """kv-tier-capacity.toml at time scale 5: the cached arm's capacity 5.07 req/s with an
    interval from 4.47 to 5.82, the two rates around it: 40 requests per rate say no more. A rate
    whose share meeting the SLO could be on either side of the required one (its interval spans
    it) is measured again with twice the requests; where both are sure, a rate half-way; narrow
    enough, or a bound: nothing."""

    def curve(pts: list[Point], probe: capacity.Ceiling | None = None) -> capacity.ArmCurve:
        return capacity.ArmCurve("a", "reuse", tuple(pts), probe, None, capacity.capacity(pts, 0.9, probe))

    def rate(r: float, n: int) -> capacity.Added:
        return capacity.Added("rate", r, n)

    unsure = curve([_point(2.0, 40), _point(4.47, 37), _point(5.82, 30)])  # 37/40: 0.80 to 0.97
    c = unsure.capacity
    assert c.req_per_s is not None and c.low == 4.47 and (capacity.width_of(c) or 0) > 0.1
    assert capacity.narrowing(unsure, 0.1) == [rate(4.47, 80)]
    sure = curve([_point(2.0, 40), _point(3.0, 40), _point(8.0, 0)])  # both sure: the crossing interpolated
    assert capacity.narrowing(sure, 0.05) == [rate(5.5, 40)]
    assert capacity.narrowing(sure, 1.0) is None  # narrow enough
    # the rate above met the SLO and failed by saturation alone: measured again, longer
    queue = curve([_point(3.0, 40), _point(8.0, 40, saturated=True, achieved=4.0)])
    assert capacity.narrowing(queue, 0.05) == [rate(8.0, 80)]
    # the capacity is the saturated throughput: its probe again, with twice the requests, until
    # its interval is narrow enough (or it has one, where it had none)
    held = [_point(3.0, 40), _point(8.0, 40, saturated=True, achieved=4.0)]
    assert capacity.narrowing(curve(held, capacity.Ceiling(4.0, 3.5, 4.6, 64)), 0.1) == [
        capacity.Added("saturated", None, 128)
    ]
    assert capacity.narrowing(curve(held, capacity.Ceiling(4.0, 3.9, 4.1, 128)), 0.1) is None
    assert capacity.narrowing(curve(held, capacity.Ceiling(4.0, None, None, 64)), 0.1) == [
        capacity.Added("saturated", None, 128)
    ]
    assert capacity.narrowing(curve([_point(1.0, 40), _point(2.0, 40)]), 0.1) is None  # at least 2
    assert capacity.narrowing(curve([_point(1.0, 10), _point(2.0, 5)]), 0.1) is None  # below 1
    # a rate measured again with more requests replaces its first measure in the curve
    pts = capacity.one_per_load([_point(4.47, 38), _point(4.47, 150, n=160), _point(5.0, 20)])
    assert [(p.offered_req_per_s, p.requests) for p in pts] == [(4.47, 160), (5.0, 40)]


def test_auto_rates_spread_up_to_and_beyond_saturation() -> None:
    rates = capacity.auto_rates(0.5, 4.5, 4)
    assert rates == pytest.approx([1.5, 2.5, 3.5, 4.5, 4.5 * capacity.AUTO_BEYOND])


def run_open(tmp_path: Path, body: str, *args: str, timeout: float = 300) -> tuple[int, str, Path]:
    sc = write_scenario(tmp_path / "s.toml", body)
    r = kvbench("run", str(sc), "--out", str(tmp_path / "out"), *args, timeout=timeout)
    return r.returncode, r.stdout + r.stderr, tmp_path / "out"


@pytest.mark.slow
def test_open_loop_on_the_emulator_keeps_its_schedule_over_worker_processes(tmp_path: Path) -> None:
    code, out, res = run_open(
        tmp_path,
        """
name = "ol-emu"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
rates = [5.0, 20.0]
requests = 60
warmup_requests = 4
pool = 8
prompt_tokens = 1000
[slo]
ttft_s = 0.5
tpot_s = 0.05
[[arms]]
name = "recompute"
cache = "bust"
[[arms]]
name = "cached"
[emulator]
time_scale = 2.0
""",
        "--workers",
        "2",
    )
    assert code == 0, out
    folders = {p.name.split("-", 1)[1]: p for p in (res / "ol-emu").iterdir() if p.is_dir()}
    assert sorted(folders) == ["cached-r20", "cached-r5", "recompute-r20", "recompute-r5"]
    for name, folder in folders.items():
        run = read_run(folder)
        recs = read_requests(folder)
        assert sorted(r.schedule_index for r in recs) == list(range(64))  # each sent once
        assert {r.process for r in recs} == {0, 1}
        assert sum(r.phase == "warmup" for r in recs) == 4
        # over both processes, the warm-up is answered before the measured part starts
        warm_end = max(r.end_s() or 0.0 for r in recs if r.phase == "warmup")
        assert min(r.start_s for r in recs if r.phase == "run") >= warm_end
        s = run.meta["summary"]
        assert s["slo"]["requests"] == 60 and s["schedule_lag"]["requests"] == 60
        assert run.meta["load"]["rate"] == float(name.split("-r")[1])
        # the schedule, split over both processes, is the arrival process asked for (how closely the
        # real sends kept to it is timing: measured, below, and reported, not asserted)
        run_recs = [r for r in recs if r.phase == "run"]
        planned = [dataclasses.replace(r, start_s=r.intended_s) for r in run_recs]
        assert stats.arrival_fit(planned, "poisson", run.rate, 1.0)["ks_p"] > 0.001, name
        fit = stats.arrival_fit(run_recs, "poisson", run.rate, 1.0)
        assert fit["gaps"] == 59 and fit["cv"] is not None and fit["ks_p"] is not None
    doc = json.loads(next((res / "ol-emu").glob("*-capacity.json")).read_text())
    assert [a["arm"] for a in doc["arms"]] == ["recompute", "cached"]
    assert doc["benefit"] and doc["benefit"][0]["with"] == "cached"
    assert "SLO capacity" in out
    r = cli("report", str(res / "ol-emu"), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert "Open loop: latency, goodput and SLO capacity" in html and "cached@20req/s" in html
    # the arrival process asked for, and how the real sends matched it
    rated = [p for p in doc["arms"][0]["points"] if p["mode"] == "rate"]
    assert rated and all(p["arrivals"] == "poisson" and p["expected_cv"] == 1.0 for p in rated)
    assert all(p["gaps_cv"] is not None and p["ks_p"] is not None for p in rated)
    assert "gap CV (expected)" in html and "Kolmogorov-Smirnov" in html


@pytest.mark.slow
def test_a_sweep_adds_loads_until_its_capacity_is_narrow_enough(tmp_path: Path) -> None:
    code, out, res = run_open(
        tmp_path,
        """
name = "narrow"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
rates = [2.0, 40.0]
requests = 12
warmup_requests = 1
pool = 8
prompt_tokens = 2000
capacity_width = 0.05
capacity_loads = 2
[slo]
ttft_s = 1.0
[[arms]]
name = "recompute"
cache = "bust"
[emulator]
time_scale = 2.0
""",
    )
    assert code == 0, out
    folders = [p for p in sorted((res / "narrow").iterdir()) if p.is_dir()]
    # the two rates, then at most capacity_loads more: a rate again with twice the requests
    # (its folder -r<rate>-n<requests>) or one half-way, each said in the terminal
    assert 2 < len(folders) <= 4 and "wider than capacity_width 5%: measuring" in out
    assert "within capacity_width" in out or "after 2 load(s) added (capacity_loads 2)" in out
    best: dict[float, int] = {}
    for f in folders:
        run = read_run(f)
        measured = sum(r.phase == "run" for r in read_requests(f))
        if "-n" in f.name:
            assert run.meta["load"]["requests"] == measured == int(f.name.rsplit("-n", 1)[1])
        else:
            assert "requests" not in run.meta["load"] and measured == 12
        best[run.rate] = max(best.get(run.rate, 0), measured)  # type: ignore[index]
    doc = json.loads(next((res / "narrow").glob("*-capacity.json")).read_text())
    points = doc["arms"][0]["points"]
    # one point per rate in the curve: the measure with the most requests
    assert {p["offered_req_per_s"]: p["requests"] for p in points} == best


def test_an_auto_sweep_held_to_saturation_measures_its_probe_again(tmp_path: Path) -> None:
    """rates = "auto" under an SLO every rate meets: the capacity is the saturated probe's
    throughput, with that probe's interval; capacity_width asks for a narrower one, so the probe
    runs again with twice the requests (its folder -saturated-n<requests>), and that one counts."""
    code, out, res = run_open(
        tmp_path,
        """
name = "auto"
[endpoint]
max_tokens = 4
[workload]
kind = "open_loop"
rates = "auto"
auto_points = 2
auto_concurrency = 4
requests = 12
warmup_requests = 1
pool = 8
prompt_tokens = 1000
capacity_width = 0.001
capacity_loads = 3
[slo]
ttft_s = 600.0
[[arms]]
name = "cached"
[emulator]
time_scale = 10.0
""",
    )
    assert code == 0, out
    # each folder's load, in the order the sweep ran them
    folders = [p for p in (res / "auto").iterdir() if p.is_dir()]
    loads = {read_run(p).meta["load"]["index"]: (p, read_run(p).meta["load"]) for p in folders}
    modes = [loads[k][1]["mode"] for k in sorted(loads)]
    assert modes[:2] == ["serial", "saturated"] and "rate" in modes
    # the probe again after the rates, each time with twice the requests, within capacity_loads
    probes = [loads[k] for k in sorted(loads) if loads[k][1]["mode"] == "saturated"]
    sizes = [sum(r.phase == "run" for r in read_requests(p)) for p, _ in probes]
    assert len(probes) >= 2 and sizes == [16 * 2**k for k in range(len(probes))], sizes
    assert modes.count("rate") - 3 + len(probes) - 1 <= 3  # the rates' three, then at most capacity_loads
    for (p, load), n in zip(probes[1:], sizes[1:], strict=True):
        assert p.name.endswith(f"-cached-saturated-n{n}") and load["requests"] == n and load["concurrency"] == 4
    assert "measuring the saturated probe x 32" in out
    (arm,) = json.loads(next((res / "auto").glob("*-capacity.json")).read_text())["arms"]
    c = arm["capacity_at_slo"]
    assert arm["saturated_requests"] == sizes[-1] and c["bound"] == "saturation"  # the longest probe counts
    assert c["req_per_s"] == arm["saturated_req_per_s"] and [c["low"], c["high"]] == arm["saturated_interval"]
    assert c["low"] is None or c["low"] <= c["req_per_s"] <= c["high"]
    assert "the arm's saturated throughput" in out
    # the report recomputes it from the folders: the same probe, its interval and its size
    r = cli("report", str(res / "auto"), "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    html = (tmp_path / "r.html").read_text()
    assert f"{sizes[-1]} requests)" in html and "Saturated closed-loop throughput" in html


@pytest.mark.parametrize(
    ("workload", "said"),
    [
        # far more than one client process can send: requests leave late
        ("rate = 20000.0\nrequests = 600", "requests left late against their schedule"),
        # one request in flight at a time, offered ten per modelled request time
        ("rate = 50.0\nrequests = 40\nmax_concurrency = 1", "held back by max_concurrency"),
    ],
)
def test_a_client_that_cannot_keep_the_schedule_is_told(tmp_path: Path, workload: str, said: str) -> None:
    code, out, res = run_open(
        tmp_path,
        f"""
name = "ol-late"
[endpoint]
max_tokens = 2
[workload]
kind = "open_loop"
{workload}
pool = 2
prompt_tokens = 200
[emulator]
profile = "recompute"
time_scale = 1.0
""",
    )
    assert code == 0, out
    assert "the offered load was not offered" in out and said in out
    (folder,) = [p for p in (res / "ol-late").iterdir() if p.is_dir()]
    meta = json.loads((folder / "run.json").read_text())
    assert any(said in w for w in meta["warnings"])
    assert meta["client_health"]["schedule_lag"]["requests"] > 0


class Cycle:
    """A reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_young_objects_are_frozen_while_an_open_loop_sends() -> None:
    """While an open loop sends, what a young collection would scan is frozen instead (nothing
    collected, the young count starts over); cycles made meanwhile are collected by the next
    freeze_heap, or in a gap once too much is frozen; afterwards the thresholds are the usual ones."""
    usual = gc.get_threshold()
    try:
        with aio.collections_in_gaps() as held:
            assert gc.get_threshold()[0] == aio.YOUNG_LIMIT
            frozen = gc.get_freeze_count()
            gone: list[str] = []
            cycle = Cycle()
            weakref.finalize(cycle, gone.append, "collected")
            del cycle
            junk = [[] for _ in range(2 * usual[0])]  # tracked objects: past the usual young threshold
            held.in_gap(0)
            assert gc.get_count()[0] < usual[0] and gc.get_freeze_count() >= frozen + 2 * usual[0]
            assert held.frozen >= usual[0] and not gone  # frozen (a young generation at least), not collected
            del junk
            aio.freeze_heap()  # the next arm's: what the last one froze is collected
            assert gone == ["collected"]
            held.frozen = 0
            # past the frozen limit, everything is collected, but only where the schedule leaves a gap
            held.frozen_limit = usual[0]
            cycle = Cycle()
            weakref.finalize(cycle, gone.append, "in a gap")
            del cycle
            junk = [[] for _ in range(2 * usual[0])]
            held.in_gap(aio.GAP_COLLECT_NS - 1)
            assert gone == ["collected"] and held.frozen == 0
            held.in_gap(aio.GAP_COLLECT_NS)
            assert gone == ["collected", "in a gap"] and held.frozen == 0
            del junk
        assert gc.get_threshold() == usual
    finally:
        gc.unfreeze()


class Allocating:
    """What closed_loop.drive asks of a Sender, each request leaving `per_request` tracked objects
    alive; each send notes the young count and threshold it starts with."""

    def __init__(self, per_request: int) -> None:
        self.spec = types.SimpleNamespace(connections=2, arm=types.SimpleNamespace(warm_from="active"))
        self.stop = asyncio.Event()
        self.per_request = per_request
        self.kept: list[list[list[int]]] = []
        self.seen: list[tuple[int, int]] = []

    def lead_for(self, prompt: object) -> None:
        return None

    async def send(self, *args: object, **kwargs: object) -> None:
        self.seen.append((gc.get_count()[0], gc.get_threshold()[0]))
        self.kept.append([[] for _ in range(self.per_request)])
        await asyncio.sleep(0)

    def check_bust(self, record: object) -> None:
        pass


def test_young_objects_are_frozen_while_a_closed_loop_sends() -> None:
    """A closed loop's requests, like an open loop's sends, find the young objects of the requests
    before them frozen, not collected: a collection in the middle of a stream delays the read of
    a first token arriving meanwhile, and the kernel then merges it with the next token under the
    later stamp. Afterwards the thresholds are the usual ones."""
    usual = gc.get_threshold()
    sender = Allocating(2 * usual[0])
    plan = Plan(12, (object(),), tuple((i, 0) for i in range(12)))  # type: ignore[arg-type]
    try:
        aio.run(closed_loop.drive(sender, plan))  # type: ignore[arg-type]
    finally:
        gc.unfreeze()
    assert len(sender.seen) == 12 and all(threshold == aio.YOUNG_LIMIT for _, threshold in sender.seen)
    assert all(young < usual[0] for young, _ in sender.seen[2:])  # each connection's earlier ones frozen
    assert gc.get_threshold() == usual


def test_the_connections_an_open_loop_opens_ahead() -> None:
    """Its share of the arrivals within one warm-up latency, plus three Poisson deviations; none
    without a measured span or a latency."""
    plan = Timed((0.0, 0.005, *(0.01 * k for k in range(1, 11))), warmup=2)  # 100 req/s
    assert open_loop.in_flight(plan, 1.0, 1.0) == math.ceil(100 + 3 * 10)
    assert open_loop.in_flight(plan, 1.0, 0.5) == math.ceil(50 + 3 * math.sqrt(50))
    assert open_loop.in_flight(plan, 0.0, 1.0) == 0
    assert open_loop.in_flight(Timed((0.0, 0.1, 0.1), warmup=1), 1.0, 1.0) == 0


def test_the_capacity_sentence_follows_the_sign() -> None:
    """Issue 34, case 3: a reuse arm worse than its bust arm lowers the capacity; the verb is
    never "raises" by default."""
    from harness.analysis.capacity import sentence

    def b(
        with_: float | None,
        without: float | None,
        bound_with: str = "interpolated",
        bound_without: str = "interpolated",
    ) -> dict:
        ratio = with_ / without if with_ and without and "below" not in (bound_with, bound_without) else None
        return {
            "with": "reuse", "without": "bust", "capacity_with": with_, "capacity_without": without,
            "bound_with": bound_with, "bound_without": bound_without,
            "ratio": ratio, "ratio_low": None, "ratio_high": None,
        }  # fmt: skip

    assert "raises SLO capacity from 2 req/s to 8 req/s (4 x)" in sentence(b(8.0, 2.0))
    assert "lowers SLO capacity from 8 req/s to 2 req/s (0.25 x)" in sentence(b(2.0, 8.0))
    assert "lowers SLO capacity from 26.8 req/s to below the lowest rate measured" in sentence(b(None, 26.8, "below"))
    assert "raises SLO capacity from below the lowest rate measured to 3 req/s" in sentence(
        b(3.0, None, bound_without="below")
    )
    assert "leaves SLO capacity below the lowest rate measured with and without it" in sentence(
        b(None, None, "below", "below")
    )
    assert "leaves SLO capacity 5 req/s" in sentence(b(5.0, 5.0))
