"""The report's sections, each built from the runs' raw records by the statistics core and
findings.py; published figures come from the reference file. One function per section, each
returning the template variables it fills. A workload kind's own sections (analysis/kinds) come
as data: `kind_sections` formats their cells and draws their plots."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any, assert_never

import numpy as np
from markupsafe import Markup

from harness.analysis import findings, stats
from harness.analysis.kinds import Audited, figures_of
from harness.analysis.kinds import document as doc
from harness.analysis.wording import num
from harness.config import kinds, reference
from harness.config.engines import MockerTiming
from harness.config.reference import redbooks
from harness.monitor import selfcheck
from harness.report import plots
from harness.results import RunResult, Table, skipped_warning
from harness.server import checks
from harness.traffic.base import ACHIEVED_WARN_SHARE

MAX_TIMELINES = 8
# The report's own sections a workload kind's runs may go into (its `report_sections`): the
# sentence for an arm that reuses the cache yet came out slower than recomputing.
SECTIONS = ("versus_recompute",)


def feeding(runs: list[RunResult], section: str) -> list[RunResult]:
    """The runs with records whose workload kind puts them into `section`."""
    assert section in SECTIONS, section
    return [r for r in runs if r.records and section in kinds.get(r.kind).report_sections]


def by_kind(runs: list[RunResult]) -> dict[str, list[RunResult]]:
    """The runs with records, by workload kind, kinds in the order their first run comes."""
    out: dict[str, list[RunResult]] = {}
    for r in runs:
        if r.records:
            out.setdefault(r.kind, []).append(r)
    return out


def kind_sections(runs: list[RunResult]) -> dict[str, Any]:
    """The sections each workload kind adds of its own, over its runs: their parts in order, the
    plots and table a section leads with first; cells formatted, plots drawn."""
    out = []
    for name, rs in by_kind(runs).items():
        for k, section in enumerate(figures_of(name).sections(rs)):
            parts = [_part(part, f"{name}-{k}-{p}") for p, part in enumerate(_parts(section))]
            out.append({"title": section.title, "text": section.text, "parts": parts})
    return {"kind_sections": out}


def _parts(section: doc.Section) -> tuple[doc.Part, ...]:
    lead = (doc.Table(section.columns, section.rows),) if section.columns else ()
    return (*section.plots, *lead, *section.parts)


def _part(part: doc.Part, name: str) -> dict[str, Any]:
    """A part as the template shows it."""
    if isinstance(part, doc.Paragraph):
        return {"type": "paragraph", "text": part.text, "tone": part.tone}
    if isinstance(part, doc.Heading):
        return {"type": "heading", "text": part.text}
    if isinstance(part, doc.Table):
        rows = [[_cell(v, part.digits) for v in row] for row in part.rows]
        marked = set(part.marked)
        return {"type": "table", "columns": part.columns, "rows": rows, "marked": marked, "folded": part.folded}
    return {"type": "plot", "svg": Markup(_drawn(part, name)), "caption": part.caption}


def _cell(v: Any, digits: int) -> tuple[str, bool]:
    """A cell's text, and whether it is flagged."""
    if isinstance(v, doc.Flag):
        return v.text, True
    if v is None or (isinstance(v, int | float) and not isinstance(v, bool)):
        return num(v, digits), False
    return str(v), False


def _drawn(plot: doc.Scatter | doc.Lines | doc.Bars, name: str) -> str:
    if isinstance(plot, doc.Scatter):
        return plots.scatter(plot, name)
    if isinstance(plot, doc.Lines):
        return plots.lines(plot, name)
    if isinstance(plot, doc.Bars):
        return plots.bars(plot, name)
    assert_never(plot)


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


def measured_claims(runs: list[RunResult]) -> dict[str, float | None]:
    """The figures of this set of runs that the claims audit sets beside the published ones: what
    each kind's runs claim (the first run that gives a figure gives it), and what follows from
    them."""
    m: dict[str, float | None] = {}
    for name, rs in by_kind(runs).items():
        if isinstance(fig := figures_of(name), Audited):
            for run in rs:
                for key, v in fig.claimed(run).items():
                    m.setdefault(key, v)
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


def cards(runs: list[RunResult], measured: dict[str, float | None]) -> list[dict[str, Any]]:
    """The key figures: each kind's (kinds in the order of their first run), then the paper's
    speedup under concurrency and drop under competing traffic, where measured."""
    out: list[doc.Card] = []
    for name, rs in by_kind(runs).items():
        if isinstance(fig := figures_of(name), Audited):
            out += fig.cards(rs)
    claimed = redbooks()["claims"]
    if measured.get("concurrency_speedup"):
        value = f"{measured['concurrency_speedup']:.1f}x"
        out.append(doc.Card("Concurrency speedup", value, f"{claimed['concurrency_speedup']}x"))
    if measured.get("traffic_drop_pct") is not None:
        drop = reference.traffic_drop()
        published = f"{drop['claimed_pct']} % claimed, {drop['drop_pct']:.1f} % from the published figures"
        out.append(doc.Card("Drop under competing traffic", f"{measured['traffic_drop_pct']:.1f} %", published))
    return [asdict(c) for c in out]


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
