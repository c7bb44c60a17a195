"""The report of a `kvbench size` result (sizing.json): for stakeholders, the figures a sizing
answers, every one labelled simulated. One table row per configuration (each tier's share of
prompt tokens and read p99, TTFT against recomputing, prefill GPU-seconds saved, the SLO), each
tier's capacity curve with the configured capacity and the knee marked, and TTFT and SLO capacity
against what the sweep varied (the shared tier's read bandwidth first). Built from the figures
sizing.json holds (sizing/fleet.py computed them); nothing is simulated again here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markupsafe import Markup

from harness.core.errors import InputError, write_file
from harness.core.units import human_bandwidth, human_size
from harness.report import plots
from harness.report.build import base, environment
from harness.sizing.result import SIZING, Sizing, knee_bytes, value, warnings


def context(results: list[Sizing]) -> dict[str, Any]:
    out = []
    for s in results:
        try:
            out.append(_one(s))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise InputError(f"{s.folder / SIZING}: a field is missing or not what kvbench writes ({e!r})") from None
    return {"sizings": out}


def _one(s: Sizing) -> dict[str, Any]:
    doc = s.doc
    configurations = doc["configurations"]
    swept: list[str] = [str(k) for k in doc["swept"]]
    rows = [_row(c, swept) for c in configurations]
    first = configurations[0] if configurations else None
    return {
        "name": str(doc["name"]),
        "folder": str(s.folder),
        "what": str(doc["what"]),
        "status": str(doc.get("status", "completed")),
        "engine": str(doc["engine"]["source"]),
        "trace": str(next(doc[k] for k in ("result", "scenario", "trace") if k in doc)["path"]),
        "replayed": _replayed(doc.get("result")) + _planned(doc.get("scenario")),
        "warnings": warnings(doc),
        "tenants": int(doc.get("tenants", 1)),
        "routing": str(doc["cluster"]["routing"]),
        "requests": int(first["figures"]["requests"]) if first else 0,
        "swept": swept,
        "tier_names": [str(t["name"]) for t in first["tiers"]] if first else [],
        # the tiers whose writes share their read bandwidth, after a prefill or (taking what the tier
        # above evicts) before a request's loads (absent from a sizing.json before `writes`)
        "shared_writes": _writing(first, "shared"),
        "evicted_writes": _writing(first, "evicted"),
        "rows": rows,
        "slo": bool(first and first["figures"]["slo"]),
        "curves": Markup(_curves(first)) if first else None,
        "first": rows[0]["label"] if rows else "",
        "knees": _knees(first) if first else [],
        "against": _against(configurations, swept),
        "replays": [_replay(c, r) for c, r in zip(configurations, rows, strict=True) if "dynamo_replay" in c],
        "replay_what": str((doc.get("engines") or {}).get("dynamo_replay", "")),
    }


def _writing(first: dict[str, Any] | None, writes: str) -> list[str]:
    """The names of the tiers of a configuration (the first) whose `writes` are these."""
    return [str(t["name"]) for t in first["tiers"] if t.get("writes") == writes] if first else []


def _replay(c: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A configuration's figures beside Dynamo's replay of it (`kvbench size --dynamo`), or why
    there is none: not modelled, or the replay's error."""
    got = c["dynamo_replay"]
    out: dict[str, Any] = {"values": row["values"], "said": None}
    if "not_modelled" in got:
        out["said"] = f"not modelled by Dynamo: {got['not_modelled']}"
    elif "error" in got:
        out["said"] = f"Dynamo's replay failed: {got['error']}"
    else:
        out |= {
            "share": sum(float(t["share"]) for t in c["figures"]["tiers"]),
            "dynamo_share": float(got["cached_share"]),
            "ttft_p50": row["ttft_p50"],
            "ttft_p99": row["ttft_p99"],
            "dynamo_p50": float(got["ttft_s"]["p50"]),
            "dynamo_p99": float(got["ttft_s"]["p99"]),
        }
    return out


def _replayed(result: dict[str, Any] | None) -> str:
    """What a result folder's replay was (nothing for a trace's)."""
    if result is None:
        return ""
    when = "when its schedule meant them to be sent" if result["arrivals"] == "intended" else "when they were sent"
    return f" (arm {result['arm']} of a {result['kind']} run, {result['block_tokens']}-token blocks, arriving {when})"


def _planned(scenario: dict[str, Any] | None) -> str:
    """What a scenario's plan was (nothing for a trace's or a result folder's)."""
    if scenario is None:
        return ""
    note = f"; {scenario['note']}" if scenario.get("note") else ""
    return (
        f" (the plan of a {scenario['kind']} scenario, not run: {scenario['block_tokens']}-token blocks, arriving as "
        f"the simulated answers let them{note})"
    )


def _row(c: dict[str, Any], swept: list[str]) -> dict[str, Any]:
    f = c["figures"]
    cached, recompute = f["ttft_s"], f["recompute_ttft_s"]
    saved, total = f["recompute_prefill_gpu_s"] - f["prefill_gpu_s"], f["recompute_prefill_gpu_s"]
    row: dict[str, Any] = {
        "label": ", ".join(f"{k} {value(k, c['swept'].get(k))}" for k in swept) or "as configured",
        "values": [value(k, c["swept"].get(k)) for k in swept],
        "workers": int(c["workers"]),
        "tiers": [
            {
                "share": float(t["share"]),
                "read_p99": human_bandwidth(float(t["read_bytes_per_s"]["p99"])),
                "write_p99": human_bandwidth(float(w["p99"])) if (w := t.get("write_bytes_per_s")) else "-",
                "free": t["read_bytes_per_s"]["mean"] is None,
            }
            for t in f["tiers"]
        ],
        "ttft_p50": cached["p50"],
        "ttft_p99": cached["p99"],
        "vs_recompute": _versus(recompute["p50"], cached["p50"]),
        "saved_gpu_s": saved,
        "saved_share": saved / total if total else None,
    }
    if (slo := f["slo"]) is not None:
        ratio = slo["capacity_ratio"]
        row["within"] = slo["cached"]["within"]
        row["ratio"] = None if ratio is None else float(ratio)
        ceiling = slo.get("speedup_ceiling")  # the search's highest: a capacity there is "at least"
        row["ratio_at_least"] = ceiling is not None and (slo["cached"]["capacity_speedup"] or 0) >= ceiling
    return row


def _versus(recompute: float | None, cached: float | None) -> str:
    """TTFT p50 against recomputing, in words that follow the figure's sign."""
    if not recompute or not cached:
        return "-"
    if cached < recompute:
        return f"{recompute / cached:.2f}x faster"
    if cached > recompute:
        return f"{cached / recompute:.2f}x slower"
    return "the same"


def _curves(c: dict[str, Any]) -> str:
    tiers = []
    for spec, t in zip(c["tiers"], c["figures"]["tiers"], strict=True):
        per_block = spec["capacity_bytes"] / spec["capacity_blocks"] if spec["capacity_blocks"] else None
        if per_block is None:
            continue
        points = t["curve"]["points"]
        knee = t["curve"]["knee_blocks"]
        tiers.append(
            {
                "name": spec["name"],
                "capacities": [p["capacity_blocks"] * per_block for p in points],
                "shares": [p.get("tier_share", p["share"]) for p in points],
                "configured": spec["capacity_blocks"] * per_block,
                "knee": None if knee is None else knee * per_block,
            }
        )
    return plots.capacity_curves(tiers)


def _knees(c: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for spec, t in zip(c["tiers"], c["figures"]["tiers"], strict=True):
        knee = knee_bytes(spec, t)
        out.append(
            {
                "name": spec["name"],
                "scope": spec["scope"],
                "capacity": human_size(spec["capacity_bytes"]),
                "knee": "-" if knee is None else human_size(knee),
                "beyond": knee is not None and knee < spec["capacity_bytes"],
            }
        )
    return out


def _against(configurations: list[dict[str, Any]], swept: list[str]) -> dict[str, Any] | None:
    """TTFT and the SLO capacity ratio against the swept key that matters most (a shared tier's
    read bandwidth, else the first swept), a line per combination of the other swept values."""
    numeric = [k for k in swept if all(c["swept"].get(k) is not None for c in configurations)]
    if not numeric or len(configurations) < 2:
        return None
    x_key = next((k for k in numeric if k.endswith("read_bandwidth")), numeric[0])
    others = [k for k in swept if k != x_key]
    lines: dict[str, list[dict[str, Any]]] = {}
    for c in configurations:
        label = ", ".join(f"{k} {value(k, c['swept'].get(k))}" for k in others) or "TTFT"
        lines.setdefault(label, []).append(c)
    scale = 1e9 if x_key.endswith(("read_bandwidth", "capacity")) else 1.0
    unit = {"read_bandwidth": " (GB/s)", "capacity": " (GB)"}.get(x_key.rsplit(".", 1)[-1], "")
    ttft: list[tuple[str, list[tuple[float, float | None]]]] = []
    ratio: list[tuple[str, list[tuple[float, float | None]]]] = []
    for label, cs in lines.items():  # (an interrupted sweep's lines may have fewer points)
        cs = sorted(cs, key=lambda c: c["swept"][x_key])
        xs = [c["swept"][x_key] / scale for c in cs]
        for q in ("p50", "p99"):
            points = list(zip(xs, [c["figures"]["ttft_s"][q] for c in cs], strict=True))
            ttft.append((f"{label} {q}" if others else f"TTFT {q}", points))
        if cs[0]["figures"]["slo"] is not None:
            name = label if others else "SLO capacity vs recomputing"
            ratio.append((name, list(zip(xs, [c["figures"]["slo"]["capacity_ratio"] for c in cs], strict=True))))
    xlabel = x_key + unit
    return {
        "key": x_key,
        "ttft": Markup(plots.against(ttft, xlabel, "simulated TTFT (s)", log_x=True)),
        "ratio": Markup(plots.against(ratio, xlabel, "SLO capacity / recomputing's", log_x=True)) if ratio else None,
    }


def render(results: list[Sizing], out: Path) -> Path:
    html = environment().get_template("sizing.html.j2").render(**base(), **context(results))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, html)
    return out
