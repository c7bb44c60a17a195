"""Assemble a report: recompute every figure from the runs' raw records, put the published ones
beside, and render one self-contained HTML file."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from harness import __version__, analysis
from harness.reference import redbooks
from harness.report import plots
from harness.report.load import LoadedRun

# (reference test, arm) -> the measured figure of the claims audit it provides
CLAIM_KEYS = {
    ("concurrency", "recompute"): "recompute_req_per_s",
    ("concurrency", "cached"): "cached_req_per_s",
    ("competing_traffic", "traffic"): "traffic_req_per_s",
    # the clean arm of a traffic run: the fairest base for its drop (same prompts, same time)
    ("competing_traffic", "clean"): "clean_req_per_s",
}
MAX_TIMELINES = 8


def _ok(df: pd.DataFrame, col: str) -> np.ndarray:
    return df.loc[df["ok"] == True, col].dropna().to_numpy(dtype=float)  # noqa: E712


def _published_req_per_s(run: LoadedRun) -> float | None:
    ref = redbooks()
    test, arm = run.reference_test, run.meta.get("arm")
    if test == "concurrency" and arm in ("recompute", "cached"):
        return float(ref["concurrency"][arm]["req_per_s"])
    if test == "competing_traffic" and arm == "traffic":
        return float(ref["competing_traffic"]["cached"]["req_per_s"])
    if test == "competing_traffic" and arm == "clean":
        return float(ref["concurrency"]["cached"]["req_per_s"])
    return None


def _run_row(run: LoadedRun) -> dict[str, Any]:
    m = run.meta
    emu = m.get("emulator") or {}
    df = run.df
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
        "profile": emu.get("profile"),
        "time_scale": m.get("time_scale", 1.0),
        "times": m.get("times"),
        "requests": len(df),
        "errors": int((df["ok"] != True).sum()) if len(df) else 0,  # noqa: E712
        "warnings": m.get("warnings") or [],
        "version": (m.get("versions") or {}).get("kvbench"),
        "commit": (m.get("versions") or {}).get("git_commit"),
        "client": m.get("client") or {},
        "scenario_hash": m.get("scenario_hash"),
        "prompt_counting": m.get("prompt_counting"),
        "lag_p99_ms": ((m.get("client_health") or {}).get("loop_lag_ms") or {}).get("p99"),
        "cpu_mean": ((m.get("client_health") or {}).get("cpu_share_of_one_core") or {}).get("mean"),
        "health_warning": (m.get("client_health") or {}).get("warning"),
    }


def _sweep_section(run: LoadedRun) -> dict[str, Any]:
    df = run.df
    table = analysis.speedup_table(df)
    groups = analysis.group_stats(df[df["ok"] == True], by=("phase", "target_tokens"))  # noqa: E712
    series = []
    for i, phase in enumerate(("cold", "warm")):
        g = groups[groups["phase"] == phase].sort_values("target_tokens")
        if g.empty:
            continue
        series.append(
            {
                "label": phase,
                "lengths": g["target_tokens"].tolist(),
                "p50": g["ttft_s_p50"].tolist(),
                "lo": g["ttft_s_p50_ci_lo"].tolist() if g["ttft_s_p50_ci_lo"].notna().all() else None,
                "hi": g["ttft_s_p50_ci_hi"].tolist(),
                "style": i,
            }
        )
    published: list[dict[str, Any]] = []
    pub_speedup: list[tuple[int, float]] = []
    if run.reference_test == "ttft":
        t = redbooks()["ttft"]
        lo_n, hi_n = int(t["prompt_tokens_min"]), int(t["prompt_tokens_max"])
        published = [
            {"label": "cold", "length": lo_n, "value": float(t["no_cache_s"][str(lo_n)])},
            {"label": "cold", "length": hi_n, "value": float(t["no_cache_s"][str(hi_n)])},
            {"label": "warm", "length": lo_n, "value": float(t["cached_s_range"][0])},
            {"label": "warm", "length": hi_n, "value": float(t["cached_s_range"][1])},
        ]
        pub_speedup = [(hi_n, 56.0)]
    kv = int(run.meta.get("scenario", {}).get("model", {}).get("kv_bytes_per_token", 73728))
    fit = analysis.fit_cost_model(df, kv)
    fit_svg = None
    if fit is not None:
        res = pd.DataFrame(fit.residuals)
        cold, warm = res[res["phase"] == "cold"], res[res["phase"] == "warm"]
        fit_svg = plots.cost_fit(
            (cold["tokens"].to_numpy(), cold["measured_s"].to_numpy()),
            (warm["tokens"].to_numpy(), warm["measured_s"].to_numpy()),
            fit.a,
            fit.b,
            fit.c,
            fit.s_per_token,
            fit.break_even_tokens,
        )
    rows = table.to_dict("records")
    return {
        "label": run.label,
        "rows": rows,
        "groups": groups.to_dict("records"),
        "published": published,
        "ttft_svg": Markup(plots.ttft_vs_length(series, published)) if series else None,
        "speedup_svg": Markup(
            plots.speedup_vs_length(
                [r["length"] for r in rows],
                [r["speedup"] for r in rows],
                [r["speedup_ci_lo"] for r in rows],
                [r["speedup_ci_hi"] for r in rows],
                pub_speedup,
            )
        )
        if rows
        else None,
        "fit": fit,
        "fit_svg": Markup(fit_svg) if fit_svg else None,
        "fit_residuals": fit.residuals if fit else [],
    }


def _measured_claims(
    runs: list[LoadedRun], sweeps: list[dict[str, Any]], loops: dict[str, analysis.ClosedLoop]
) -> dict[str, float | None]:
    m: dict[str, float | None] = {}
    for s in sweeps:
        for r in s["rows"]:
            if r["length"] == 130000 and r["speedup"]:
                m["ttft_speedup_130k"] = r["speedup"]
    for run in runs:
        cl = loops.get(run.label)
        if cl is None:
            continue
        key = CLAIM_KEYS.get((run.reference_test or "", str(run.meta.get("arm"))))
        if key and key not in m:
            m[key] = cl.req_per_s
    rec, cac, tra = m.get("recompute_req_per_s"), m.get("cached_req_per_s"), m.get("traffic_req_per_s")
    if rec and cac:
        m["concurrency_speedup"] = cac / rec
    clean = m.pop("clean_req_per_s", None)
    if not cac and clean:
        m["cached_req_per_s"] = cac = clean
    base = clean or cac
    if base and tra:
        m["traffic_base_req_per_s"] = base
        m["traffic_drop_pct"] = analysis.drop(base, tra)["drop_pct"]
    if rec and tra:
        m["traffic_vs_recompute"] = tra / rec
    return m


def build_context(runs: list[LoadedRun]) -> dict[str, Any]:
    rows = [_run_row(r) for r in runs]
    sweeps = [_sweep_section(r) for r in runs if r.kind == "sweep" and not r.df.empty]
    loops = {r.label: analysis.closed_loop(r.df) for r in runs if r.kind == "closed_loop" and not r.df.empty}
    loop_rows = []
    for r in runs:
        cl = loops.get(r.label)
        if cl is not None:
            loop_rows.append(
                {
                    "label": r.label,
                    "cl": cl,
                    "published": _published_req_per_s(r),
                    "concurrency": r.meta.get("scenario", {}).get("workload", {}).get("concurrency"),
                }
            )
    bars_svg = None
    if loop_rows:
        bars_svg = Markup(
            plots.bars(
                [x["label"] for x in loop_rows],
                [x["cl"].req_per_s for x in loop_rows],
                [x["published"] for x in loop_rows],
                "requests per second",
            )
        )
    measured = _measured_claims(runs, sweeps, loops)
    claims = analysis.claims_audit(redbooks(), measured)
    comparisons = []
    base, loaded = measured.get("traffic_base_req_per_s"), measured.get("traffic_req_per_s")
    if base and loaded:
        d = analysis.drop(base, loaded)
        comparisons.append({"what": "cached req/s, clean -> with competing traffic", **d, "published_drop_pct": 15.5})
    ttft_series = [(r.label, _ok(r.df, "ttft_s")) for r in runs if not r.df.empty]
    e2e_series = [(r.label, _ok(r.df, "e2e_s")) for r in runs if not r.df.empty]
    timelines = []
    for r in [r for r in runs if not r.df.empty][:MAX_TIMELINES]:
        df = r.df
        groups = []
        key = "phase" if r.kind == "sweep" else "arm"
        for name, g in df.groupby(key, sort=True):
            groups.append(
                (
                    str(name),
                    g["start_s"].to_numpy(dtype=float),
                    (g["start_s"] + g["ttft_s"].astype(float)).to_numpy(dtype=float),
                    g["end_s"].to_numpy(dtype=float),
                )
            )
        traffic = None
        if r.traffic_rows:
            per_t: dict[float, float] = {}
            for row in r.traffic_rows:
                per_t[row["t_s"]] = per_t.get(row["t_s"], 0.0) + (row["read_bps"] + row["write_bps"]) / 1e9
            ts = sorted(per_t)
            traffic = (np.array(ts), np.array([per_t[t] for t in ts]))
        timelines.append(
            {
                "label": r.label,
                "n": len(df),
                "svg": Markup(plots.timeline(groups, traffic)),
                "traffic": traffic is not None,
            }
        )
    cache_rows = []
    for r in runs:
        if r.df.empty:
            continue
        allowance = int(r.meta.get("scenario", {}).get("workload", {}).get("shared_prefix_tokens") or 0) + 64
        cache_rows.append({"label": r.label, **analysis.cache_verification(r.df, allowance)})
    errors = []
    for r in runs:
        if r.df.empty or "error" not in r.df:
            continue
        counts = Counter(str(e) for e in r.df["error"].dropna())
        errors += [{"label": r.label, "error": e, "count": n} for e, n in counts.most_common(20)]
    group_tables = []
    for r in runs:
        if not r.df.empty:
            group_tables.append({"label": r.label, "rows": analysis.group_stats(r.df).to_dict("records")})
    traffic_rows = []
    for r in runs:
        if r.traffic:
            t = r.traffic
            share = t.get("achieved_share")
            traffic_rows.append(
                {
                    "label": r.label,
                    "tool": t.get("tool"),
                    "emulated": t.get("emulated"),
                    "target": t.get("target_bytes_per_s"),
                    "achieved": t.get("achieved_bytes_per_s"),
                    "share": share,
                    "low": share is not None and share < 0.9,
                    "clients": t.get("per_client") or {},
                    "warnings": t.get("warnings") or [],
                    "note": t.get("note", ""),
                }
            )
    server_rows = []
    for r in runs:
        sm = r.server_metrics
        if not sm:
            continue
        for phase, p in sm.get("phases", {}).items():
            m = p.get("mapped", {})
            ratio = p.get("server_hit_ratio")
            server_rows.append(
                {
                    "label": r.label,
                    "phase": phase,
                    "requests": p.get("requests"),
                    "hit_ratio": ratio,
                    "low": phase == "warm" and ratio is not None and ratio < 0.5,
                    "families": ", ".join(m.get("families", [])) or "unknown (raw deltas kept)",
                    "external_hits": m.get("external_hit_tokens", m.get("kvbm_matched_tokens")),
                    "onboarded": m.get("kvbm_onboard_blocks_d2d"),
                    "offloaded": m.get("kvbm_offload_blocks_d2d"),
                    "client_ttft": p.get("client_ttft_mean_s"),
                    "server_ttft": p.get("server_ttft_mean_s"),
                    "overhead": p.get("client_minus_server_ttft_s"),
                }
            )
    emulated = any(x["emulated"] for x in rows)
    cards = _cards(measured, loop_rows, sweeps)
    return {
        "generated": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "version": __version__,
        "runs": rows,
        "emulated": emulated,
        "any_interrupted": any(x["status"] != "completed" for x in rows),
        "cards": cards,
        "sweeps": sweeps,
        "loops": loop_rows,
        "bars_svg": bars_svg,
        "comparisons": comparisons,
        "claims": claims,
        "ttft_cdf": Markup(plots.cdfs(ttft_series, "TTFT (s, log scale)", "cdf-ttft")) if ttft_series else None,
        "e2e_cdf": Markup(plots.cdfs(e2e_series, "end-to-end latency (s, log scale)", "cdf-e2e"))
        if e2e_series
        else None,
        "timelines": timelines,
        "traffic": traffic_rows,
        "server_rows": server_rows,
        "server_unreachable": [
            (r.label, u, why)
            for r in runs
            if r.server_metrics
            for u, why in (r.server_metrics.get("unreachable") or {}).items()
        ],
        "timelines_omitted": max(0, len([r for r in runs if not r.df.empty]) - MAX_TIMELINES),
        "cache_rows": cache_rows,
        "errors": errors,
        "group_tables": group_tables,
        "source": redbooks()["source"],
    }


def _cards(
    measured: dict[str, float | None], loops: list[dict[str, Any]], sweeps: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    cards: list[dict[str, Any]] = []
    if measured.get("ttft_speedup_130k"):
        cards.append(
            {
                "title": "TTFT speedup at 130K tokens",
                "value": f"{measured['ttft_speedup_130k']:.1f}x",
                "published": "56x",
            }
        )
    elif sweeps and sweeps[0]["rows"]:
        last = sweeps[0]["rows"][-1]
        if last["speedup"]:
            cards.append(
                {
                    "title": f"TTFT speedup at {last['length']:,} tokens",
                    "value": f"{last['speedup']:.1f}x",
                    "published": None,
                }
            )
    for x in loops:
        if x["cl"].req_per_s is not None:
            pub = f"{x['published']:g} req/s" if x["published"] else None
            cards.append(
                {"title": f"{x['label']} throughput", "value": f"{x['cl'].req_per_s:.3g} req/s", "published": pub}
            )
    if measured.get("concurrency_speedup"):
        cards.append(
            {"title": "Concurrency speedup", "value": f"{measured['concurrency_speedup']:.1f}x", "published": "22x"}
        )
    if measured.get("traffic_drop_pct") is not None:
        cards.append(
            {
                "title": "Drop under competing traffic",
                "value": f"{measured['traffic_drop_pct']:.1f} %",
                "published": "18 % claimed, 15.5 % from the published figures",
            }
        )
    return cards


def render(runs: list[LoadedRun], out: Path) -> Path:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = _num
    html = env.get_template("report.html.j2").render(**build_context(runs))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(html, encoding="utf-8")
    return out


def _num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"
