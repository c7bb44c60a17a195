"""The report's sections, each built from the runs' raw records by the statistics core and
findings.py; published figures come from the reference file. One function per section, each
returning the template variables it fills."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

import numpy as np
from markupsafe import Markup

from harness.analysis import capacity, findings, stats, wording
from harness.analysis.kinds import Scatter, figures_of
from harness.config import kinds, reference
from harness.config.engines import MockerTiming
from harness.config.reference import redbooks
from harness.monitor import selfcheck
from harness.report import plots
from harness.report.format import num
from harness.results import RunResult, Table, skipped_warning
from harness.server import checks
from harness.traffic.base import ACHIEVED_WARN_SHARE

# (reference test, arm) -> the measured figure of the claims audit it provides
CLAIM_KEYS = {
    ("concurrency", "recompute"): "recompute_req_per_s",
    ("concurrency", "cached"): "cached_req_per_s",
    ("competing_traffic", "traffic"): "traffic_req_per_s",
    # the clean arm of a traffic run: the fairest base for its drop (same prompts, same time)
    ("competing_traffic", "clean"): "clean_req_per_s",
}
MAX_TIMELINES = 8
# The report's own sections a workload kind's runs may go into (its `report_sections`): a sweep's
# table and plots by prompt length, a closed loop's throughput against the paper's, an open
# loop's loads and SLO capacity, and the sentence for an arm that reuses the cache yet came out
# slower than recomputing.
SECTIONS = ("by_length", "loop", "capacity", "versus_recompute")


def feeding(runs: list[RunResult], section: str) -> list[RunResult]:
    """The runs with records whose workload kind puts them into `section`."""
    assert section in SECTIONS, section
    return [r for r in runs if r.records and section in kinds.get(r.kind).report_sections]


def kind_sections(runs: list[RunResult]) -> dict[str, Any]:
    """The sections each workload kind adds of its own, over its runs: their tables as they are,
    their plots drawn."""
    by_kind: dict[str, list[RunResult]] = {}
    for r in runs:
        if r.records:
            by_kind.setdefault(r.kind, []).append(r)
    out = []
    for name, rs in by_kind.items():
        for k, section in enumerate(figures_of(name).sections(rs)):
            drawn = [
                {"svg": Markup(_scatter(plot, f"{name}-{k}-{p}")), "caption": plot.caption}
                for p, plot in enumerate(section.plots)
            ]
            # (its fields as they are: asdict would copy every plotted point only to replace them)
            fields = {"title": section.title, "text": section.text, "columns": section.columns, "rows": section.rows}
            out.append({**fields, "plots": drawn})
    return {"kind_sections": out}


def _scatter(plot: Scatter, name: str) -> str:
    series = [{"label": s.label, "x": s.x, "y": s.y, "style": i} for i, s in enumerate(plot.series)]
    return plots.scatter(series, plot.x_label, plot.y_label, name, logy=plot.logy)


def run_row(run: RunResult) -> dict[str, Any]:
    m = run.meta
    health = m.get("client_health") or {}
    versions = m.get("versions") or {}
    return {
        "label": run.label,
        "folder": str(run.folder),
        "status": m.get("status"),
        "kind": run.kind,
        "endpoint": m.get("endpoint"),
        "model": m.get("model"),
        "started": m.get("started"),
        "ended": m.get("ended"),
        "emulated": bool(m.get("emulated")),
        "engine": engine_text(m.get("engine")),
        "profile": (m.get("emulator") or {}).get("profile"),
        "time_scale": m.get("time_scale", 1.0),
        "times": m.get("times"),
        "requests": len(run.records),
        "errors": len(run.records) - len(stats.ok(run.records)),
        "warnings": (m.get("warnings") or []) + ([skipped_warning([run])] if run.skipped else []),
        "version": versions.get("kvbench"),
        "commit": versions.get("git_commit"),
        "client": m.get("client") or {},
        "scenario_hash": m.get("scenario_hash"),
        "prompt_counting": m.get("prompt_counting"),
        "lag_p99_ms": (health.get("loop_lag_ms") or {}).get("p99"),
        "schedule_lag_p99_ms": _ms((health.get("schedule_lag") or {}).get("p99_s")),
        "cpu_mean": (health.get("cpu_share_of_one_core") or {}).get("mean"),
        "health_warning": health.get("warning"),
        "emulator_warning": selfcheck.emulator_warning((m.get("emulator") or {}).get("lateness")),
    }


def engine_text(info: Any) -> str | None:
    """The engine kvbench started for a run (run.json `engine`), in a line: what it is, and for
    Dynamo its router and each worker's tiers as this arm ran them."""
    if not isinstance(info, dict) or info.get("started_by") != "kvbench":
        return None
    version = f" {info['version']}" if info.get("version") else ""
    if info.get("kind") != "dynamo":
        return f"llama.cpp's llama-server{version}, started by kvbench"
    text = (
        f"NVIDIA Dynamo{version}, started by kvbench: frontend with router {info.get('router_mode')} over "
        f"{info.get('workers')} mocker worker(s) (times modelled by the mocker, not measured on hardware)"
    )
    tiers = info.get("tiers")
    if isinstance(tiers, dict):
        g1, g2 = tiers.get("g1") or {}, tiers.get("g2")
        text += f"; per worker G1 {g1.get('blocks')} blocks of {tiers.get('block_size')} tokens"
        text += f", G2 {g2.get('blocks')} blocks at {g2.get('bandwidth')}" if isinstance(g2, dict) else ", no G2"
    timing = info.get("timing")
    if isinstance(timing, dict) and all(isinstance(timing.get(k), int | float) for k in MockerTiming.keys):
        text += (
            f"; times from [engine] timing: prefill {timing['prefill_a']:.3g}*n + {timing['prefill_b']:.3g}*n^2 s "
            f"for n tokens computed, {timing['decode_s_per_token']:.3g} s an output token"
        )
    elif isinstance(timing, dict):
        text += "; times from the mocker's built-in polynomials"
    return text


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def _published_sweep() -> tuple[list[dict[str, Any]], list[tuple[int, float]]]:
    t = redbooks()["ttft"]
    lo_n, hi_n = int(t["prompt_tokens_min"]), int(t["prompt_tokens_max"])
    points = [
        {"label": "cold", "length": lo_n, "value": float(t["no_cache_s"][str(lo_n)])},
        {"label": "cold", "length": hi_n, "value": float(t["no_cache_s"][str(hi_n)])},
        {"label": "warm", "length": lo_n, "value": float(t["cached_s_range"][0])},
        {"label": "warm", "length": hi_n, "value": float(t["cached_s_range"][1])},
    ]
    return points, [(hi_n, float(redbooks()["claims"]["ttft_speedup"]))]


def _ttft_series(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    series = []
    for i, phase in enumerate(("cold", "warm")):
        g = sorted((row for row in groups if row["phase"] == phase), key=lambda row: row["target_tokens"])
        if not g:
            continue
        lo = [row["ttft_s_p50_ci_lo"] for row in g]
        series.append(
            {
                "label": phase,
                "lengths": [row["target_tokens"] for row in g],
                "p50": [row["ttft_s_p50"] for row in g],
                "lo": lo if all(v is not None for v in lo) else None,
                "hi": [row["ttft_s_p50_ci_hi"] for row in g],
                "style": i,
            }
        )
    return series


def _fit_svg(fit: findings.CostFit) -> Markup:
    def points(phase: str) -> tuple[np.ndarray, np.ndarray]:
        rows = [r for r in fit.residuals if r["phase"] == phase]
        return np.asarray([r["tokens"] for r in rows]), np.asarray([r["measured_s"] for r in rows])

    return Markup(
        plots.cost_fit(points("cold"), points("warm"), fit.a, fit.b, fit.c, fit.s_per_token, fit.break_even_tokens)
    )


def sweep(run: RunResult) -> dict[str, Any]:
    rows = stats.sweep_rows(run.records, intervals=True)
    groups = findings.group_stats(stats.ok(run.records), by=("phase", "target_tokens"))
    series = _ttft_series(groups)
    published, pub_speedup = _published_sweep() if run.reference_test == "ttft" else ([], [])
    restores = findings.restores(run.records)
    # KV bytes per token: the scenario's, else what the engine's restores read, else the paper's model's
    engine_kv = restores["kv_bytes_per_token"] if restores else None
    kv = int(run.scenario.get("model", {}).get("kv_bytes_per_token") or engine_kv or reference.kv_bytes_per_token())
    fit = findings.fit_cost_model(run.records, kv)
    speedup_svg = plots.speedup_vs_length(
        [r["length"] for r in rows],
        [r["speedup"] for r in rows],
        [r["speedup_ci_lo"] for r in rows],
        [r["speedup_ci_hi"] for r in rows],
        pub_speedup,
    )
    return {
        "label": run.label,
        "rows": rows,
        "groups": groups,
        "published": published,
        "ttft_svg": Markup(plots.ttft_vs_length(series, published)) if series else None,
        "speedup_svg": Markup(speedup_svg) if rows else None,
        "fit": fit,
        "fit_svg": _fit_svg(fit) if fit else None,
        "fit_residuals": fit.residuals if fit else [],
        "restores": restores,
        "tiers": run.meta.get("tiers") if isinstance(run.meta.get("tiers"), dict) else None,
        "late": wording.late_rows(rows),
        "late_note": wording.LATE_ROWS,
    }


def loops(runs: list[RunResult]) -> dict[str, Any]:
    rows = []
    for r in feeding(runs, "loop"):
        rows.append(
            {
                "label": r.label,
                "cl": stats.throughput(r.records),
                "ttft": stats.describe(stats.values(r.records, "ttft_s")),
                "published": reference.req_per_s(r.reference_test, r.arm),
                "concurrency": r.scenario.get("workload", {}).get("concurrency"),
                "restores": findings.restores(r.records),
                "tiers": r.meta.get("tiers") if isinstance(r.meta.get("tiers"), dict) else None,
            }
        )
    bars = None
    if rows:
        bars = plots.bars(
            [x["label"] for x in rows],
            [x["cl"].req_per_s for x in rows],
            [x["published"] for x in rows],
            "requests per second",
        )
    return {"loops": rows, "bars_svg": Markup(bars) if bars else None}


def measured_claims(
    runs: list[RunResult], sweeps: list[dict[str, Any]], loop_rows: list[dict[str, Any]]
) -> dict[str, float | None]:
    """The figures of this set of runs that the claims audit sets beside the published ones."""
    m: dict[str, float | None] = {}
    for s in sweeps:
        for r in s["rows"]:
            if r["length"] == reference.ttft_speedup_length() and r["speedup"]:
                m["ttft_speedup_max"] = r["speedup"]
    by_label = {x["label"]: x["cl"] for x in loop_rows}
    for run in runs:
        key = CLAIM_KEYS.get((run.reference_test or "", run.arm))
        if run.label in by_label and key and key not in m:
            m[key] = by_label[run.label].req_per_s
    rec, cac, tra = m.get("recompute_req_per_s"), m.get("cached_req_per_s"), m.get("traffic_req_per_s")
    if rec and cac:
        m["concurrency_speedup"] = cac / rec
    clean = m.pop("clean_req_per_s", None)
    if not cac and clean:
        m["cached_req_per_s"] = cac = clean
    base = clean or cac
    if base and tra:
        m["traffic_base_req_per_s"] = base
        m["traffic_drop_pct"] = stats.drop(base, tra)["drop_pct"]
    if rec and tra:
        m["traffic_vs_recompute"] = tra / rec
    return m


def claims(measured: dict[str, float | None]) -> dict[str, Any]:
    comparisons = []
    base, loaded = measured.get("traffic_base_req_per_s"), measured.get("traffic_req_per_s")
    if base and loaded:
        pub = reference.traffic_drop()
        comparisons.append(
            {
                "what": "cached req/s, clean -> with competing traffic",
                **stats.drop(base, loaded),
                "published_before": pub["before"],
                "published_after": pub["after"],
                "published_drop_pct": pub["drop_pct"],
            }
        )
    return {"claims": findings.claims_audit(redbooks(), measured), "comparisons": comparisons}


def cards(
    measured: dict[str, float | None], loop_rows: list[dict[str, Any]], sweeps: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    claimed = redbooks()["claims"]
    out: list[dict[str, Any]] = []
    if measured.get("ttft_speedup_max"):
        n = reference.ttft_speedup_length()
        value = f"{measured['ttft_speedup_max']:.1f}x"
        out.append(
            {
                "title": f"TTFT speedup at {n // 1000}K tokens",
                "value": value,
                "published": f"{claimed['ttft_speedup']}x",
            }
        )
    elif sweeps and sweeps[0]["rows"] and sweeps[0]["rows"][-1]["speedup"]:
        last = sweeps[0]["rows"][-1]
        out.append(
            {
                "title": f"TTFT speedup at {last['length']:,} tokens"
                + (" (restore included)" if sweeps[0].get("restores") else ""),
                "value": f"{last['speedup']:.1f}x",
                "published": None,
            }
        )
    for x in loop_rows:
        if x["cl"].req_per_s is not None:
            pub = f"{x['published']:g} req/s" if x["published"] else None
            out.append(
                {"title": f"{x['label']} throughput", "value": f"{x['cl'].req_per_s:.3g} req/s", "published": pub}
            )
    if measured.get("concurrency_speedup"):
        value = f"{measured['concurrency_speedup']:.1f}x"
        out.append({"title": "Concurrency speedup", "value": value, "published": f"{claimed['concurrency_speedup']}x"})
    if measured.get("traffic_drop_pct") is not None:
        drop = reference.traffic_drop()
        out.append(
            {
                "title": "Drop under competing traffic",
                "value": f"{measured['traffic_drop_pct']:.1f} %",
                "published": f"{drop['claimed_pct']} % claimed, {drop['drop_pct']:.1f} % from the published figures",
            }
        )
    return out


def distributions(runs: list[RunResult]) -> dict[str, Any]:
    have = [r for r in runs if r.records]
    ttft = [(r.label, plots.cdf_points(stats.values(r.records, "ttft_s"))) for r in have]
    e2e = [(r.label, plots.cdf_points(stats.values(r.records, "e2e_s"))) for r in have]
    return {
        "ttft_cdf": Markup(plots.cdfs(ttft, "TTFT (s, log scale)", "cdf-ttft")) if ttft else None,
        "e2e_cdf": Markup(plots.cdfs(e2e, "end-to-end latency (s, log scale)", "cdf-e2e")) if e2e else None,
    }


def _traffic_line(run: RunResult) -> tuple[np.ndarray, np.ndarray] | None:
    if not run.traffic_rows:
        return None
    per_t: dict[float, float] = {}
    for row in run.traffic_rows:
        per_t[row["t_s"]] = per_t.get(row["t_s"], 0.0) + (row["read_bps"] + row["write_bps"]) / 1e9
    ts = sorted(per_t)
    return np.array(ts), np.array([per_t[t] for t in ts])


# A timeline draws at most about this many requests: a run with more is drawn every k-th (in the
# order of its records), and says so
TIMELINE_REQUESTS = 20_000


def timelines(runs: list[RunResult]) -> dict[str, Any]:
    have = [r for r in runs if r.records]
    out = []
    for r in have[:MAX_TIMELINES]:
        key = "phase" if kinds.get(r.kind).per_length else "arm"
        groups = []
        every = -(-len(r.records) // TIMELINE_REQUESTS)  # a line per request stops being readable
        for (name,), all_of in stats.groups(r.records, (key,)).items():
            g = all_of[::every]
            start = g.numbers("start_s")
            first, end = start + g.numbers("ttft_s"), start + g.numbers("e2e_s")
            groups.append((str(name), start, first, end))
        traffic = _traffic_line(r)
        out.append(
            {
                "label": r.label,
                "n": len(r.records),
                "every": every,
                "svg": Markup(plots.timeline(groups, traffic)),
                "traffic": traffic is not None,
            }
        )
    return {"timelines": out, "timelines_omitted": max(0, len(have) - MAX_TIMELINES)}


def verification(runs: list[RunResult]) -> dict[str, Any]:
    cache_rows = [
        {
            "label": r.label,
            **findings.cache_verification(r.records, checks.allowance_of(r.meta), checks.block_of(r.meta)),
            "block": checks.block_of(r.meta),
            "block_source": (r.meta.get("warm_rule") or {}).get("source"),
        }
        for r in runs
        if r.records
    ]
    errors = []
    for r in runs:
        counts = Counter(str(x.error) for x in stats.erred(r.records))
        errors += [{"label": r.label, "error": e, "count": n} for e, n in counts.most_common(20)]
    group_tables = []
    for r in runs:
        if r.records:
            rows = findings.group_stats(r.records)
            group_tables.append({"label": r.label, "rows": rows, "binned": any("tokens_bin" in x for x in rows)})
    return {
        "cache_rows": cache_rows,
        "errors": errors,
        "group_tables": group_tables,
        "gaps_held": f"{stats.GAPS_HELD:,}",
    }


def traffic(runs: list[RunResult]) -> dict[str, Any]:
    rows = []
    for r in runs:
        t = r.traffic
        if not t:
            continue
        share = t.get("achieved_share")
        rows.append(
            {
                "label": r.label,
                "tool": t.get("tool"),
                "emulated": t.get("emulated"),
                "target": t.get("target_bytes_per_s"),
                "achieved": t.get("achieved_bytes_per_s"),
                "share": share,
                "low": share is not None and share < ACHIEVED_WARN_SHARE,
                "clients": t.get("per_client") or {},
                "warnings": t.get("warnings") or [],
                "note": t.get("note", ""),
            }
        )
    return {"traffic": rows}


def _server_row(label: str, phase: str, p: dict[str, Any]) -> dict[str, Any]:
    m = p.get("mapped", {})
    ratio = p.get("server_hit_ratio")
    return {
        "label": label,
        "phase": phase,
        "requests": p.get("requests"),
        "hit_ratio": ratio,
        "router_hit_ratio": m.get("dynamo_router_kv_hit_ratio"),
        "low": phase == "warm" and ratio is not None and ratio < checks.LOW_WARM_HIT_RATIO,
        "families": ", ".join(m.get("families", [])) or "unknown (raw deltas kept)",
        "external_hits": m.get("external_hit_tokens", m.get("kvbm_matched_tokens")),
        "onboarded": m.get("kvbm_onboard_blocks_d2d"),
        "offloaded": m.get("kvbm_offload_blocks_d2d"),
        "client_ttft": p.get("client_ttft_mean_s"),
        "server_ttft": p.get("server_ttft_mean_s"),
        "overhead": p.get("client_minus_server_ttft_s"),
    }


def server(runs: list[RunResult]) -> dict[str, Any]:
    rows, unreachable = [], []
    for r in runs:
        sm = r.server_metrics
        if not sm:
            continue
        rows += [_server_row(r.label, phase, p) for phase, p in sm.get("phases", {}).items()]
        unreachable += [(r.label, u, why) for u, why in (sm.get("unreachable") or {}).items()]
    return {"server_rows": rows, "server_unreachable": unreachable}


def open_loop(runs: list[RunResult]) -> dict[str, Any]:
    """Open loops: per arm its loads (latency, goodput, schedule lag), saturation and SLO
    capacity, curves against offered load, and the tier's benefit as capacity."""
    arms = capacity.curves(feeding(runs, "capacity"))
    if not arms:
        return {"open_arms": [], "benefit": [], "open_ttft_svg": None, "open_goodput_svg": None}
    ttft, good = [], []
    for i, a in enumerate(arms):
        x = [p.offered_req_per_s for p in a.points]
        cap = a.capacity.req_per_s if a.capacity.bound in ("measured", "saturation") else None
        ttft.append(
            {
                "label": f"{a.arm} TTFT p50",
                "x": x,
                "y": [p.ttft_p50_s for p in a.points],
                "style": i,
                "capacity": cap,
                "saturation": a.saturation_rate,
            }
        )
        ttft.append(
            {"label": f"{a.arm} TTFT p99", "x": x, "y": [p.ttft_p99_s for p in a.points], "style": i, "dashed": True}
        )
        if any(p.goodput_req_per_s is not None for p in a.points):
            good.append(
                {
                    "label": f"{a.arm} goodput",
                    "x": x,
                    "y": [p.goodput_req_per_s for p in a.points],
                    "style": i,
                    "capacity": cap,
                    "saturation": a.saturation_rate,
                }
            )
        good.append(
            {
                "label": f"{a.arm} completed",
                "x": x,
                "y": [p.achieved_req_per_s for p in a.points],
                "style": i,
                "dashed": True,
            }
        )
    return {
        "open_arms": [
            {
                "arm": a.arm,
                "points": a.points,
                "capacity": capacity.capacity_text(asdict(a.capacity)) if a.capacity.bound != "no_slo" else None,
                "saturation_rate": a.saturation_rate,
                "saturated": a.saturated,
            }
            for a in arms
        ],
        "benefit": [capacity.sentence(b) for b in capacity.benefit(arms)],
        "open_ttft_svg": Markup(plots.against_load(ttft, "TTFT (s)", "open-ttft", log=True)),
        "open_goodput_svg": Markup(plots.against_load(good, "requests / s", "open-goodput")),
    }


def versus_recompute(runs: list[RunResult]) -> dict[str, Any]:
    """A plain sentence wherever an arm that reuses the cache was slower than recomputing."""
    return {"slower_than_recompute": slower_than_recompute(runs)}


def slower_than_recompute(runs: list[RunResult]) -> list[str]:
    """For each set of arms run together (one run id; not sweeps or open loops, which have their
    own comparisons), the arms that reuse the cache whose TTFT median is above a bust arm's."""
    sets: dict[str, list[RunResult]] = {}
    for r in feeding(runs, "versus_recompute"):
        sets.setdefault(str(r.meta.get("run_id")), []).append(r)

    def ttft_p50(run: RunResult) -> float | None:
        return stats.percentile(stats.values(stats.measured(run.records), "ttft_s"), 50)

    out = []
    for group in sets.values():
        busts = [r for r in group if r.meta.get("arm_cache") == "bust"]
        for bust in busts[:1]:
            base = ttft_p50(bust)
            for r in group:
                if r.meta.get("arm_cache") == "bust" or base is None:
                    continue
                ttft = ttft_p50(r)
                if ttft is not None and ttft > base:
                    out.append(
                        f"{r.label} was slower than recomputing: TTFT p50 {num(ttft)} s against {num(base)} s "
                        f"for {bust.label}, which computes every prompt anew. Bringing these prompts' KV back "
                        "cost more than computing it again."
                    )
    return out


def clients(runs: list[RunResult]) -> dict[str, Any]:
    """Runs sent from several client processes (--workers) or Ray workers: each one's health,
    what it sent, and its clock against the coordinator's; which of them held the load back."""
    rows, bottlenecks = [], []
    for run in runs:
        health = run.meta.get("client_health") or {}
        per = health.get("per_process") or []
        placed = {w["worker"]: w for w in (run.meta.get("distributed") or {}).get("workers", [])}
        for i, h in enumerate(per):
            k = h.get("worker", i)
            mine = Table.of(run.records)
            mine = mine.where(mine.numbers("process") == k)
            lag = stats.schedule_lag_of(run.records, k) or {}
            where = placed.get(k, {})
            clock = where.get("clock_start") or {}
            rows.append(
                {
                    "label": run.label,
                    "worker": k,
                    "host": h.get("hostname") or (run.meta.get("client") or {}).get("hostname"),
                    "node": h.get("node_ip"),
                    "requests": len(mine),
                    "failed": len(mine) - len(stats.ok(mine)),
                    "lag_p99_ms": (h.get("loop_lag_ms") or {}).get("p99"),
                    "cpu_mean": (h.get("cpu_share_of_one_core") or {}).get("mean"),
                    "schedule_lag_p99_ms": _ms(lag.get("p99_s")),
                    "clock_uncertainty_ms": clock["uncertainty_ns"] / 1e6 if clock else None,
                }
            )
            if h.get("warning"):
                bottlenecks.append(f"{run.label}: worker {k} on {rows[-1]['host']} was the bottleneck: {h['warning']}")
        for row in placed.values():
            if row.get("lost"):
                bottlenecks.append(f"{run.label}: worker {row['worker']} on {row['hostname']} was lost: {row['lost']}")
    return {"client_rows": rows, "client_notes": bottlenecks}
