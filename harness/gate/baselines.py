"""Baselines: compact JSON saved from result folders, and what makes two runs comparable.

A baseline keeps, per (arm, phase, length), up to MAX_SAMPLES per-request values of each metric
(a seeded uniform subsample beyond that, enough for the significance test) plus summaries, and
per arm the run-level figures of every run it was made from. It also keeps what makes runs
comparable (scenario name, the hash of its file as written, kind, time scale) so that the gate refuses
to compare runs of different tests.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from harness import __version__
from harness.analysis import stats
from harness.core.errors import InputError, read_input, write_file
from harness.gate import figures
from harness.gate.figures import Figures
from harness.results import RunResult

SCHEMA_VERSION = 1
MAX_SAMPLES = 5000


def identity(runs: list[RunResult]) -> dict[str, Any]:
    """What must match between a baseline and a candidate."""
    metas = [r.meta for r in runs]
    w = metas[0].get("scenario", {}).get("workload", {})
    return {
        "scenario_name": metas[0].get("scenario_name"),
        # the scenario file's keys as written, the workload's all included (Scenario.digest)
        "scenario_hash": sorted({m.get("scenario_hash") for m in metas}),
        "kind": w.get("kind"),
        "time_scale": sorted({float(m.get("time_scale", 1.0)) for m in metas}),
        "arms": sorted({str(m.get("arm")) for m in metas}),
        "workload": w,  # the kind's keys, to say which of them differ
    }


# Workload keys a baseline saved before the kinds had configs of their own kept beside the hash
LEGACY_WORKLOAD_KEYS = ("concurrency", "lengths", "prompt_tokens")


def check_compatible(base: dict[str, Any], cand: dict[str, Any]) -> None:
    """Refuse to compare runs of different tests; say what differs."""
    diffs = [
        f"{k}: baseline {base.get(k)!r}, candidate {cand.get(k)!r}"
        for k in ("scenario_name", "scenario_hash", "kind", "time_scale")
        if base.get(k) != cand.get(k)
    ]
    was = base.get("workload") or {k: base[k] for k in LEGACY_WORKLOAD_KEYS if k in base}
    now = cand.get("workload") or {}
    # (a key the candidate lacks is left to the hash: an older baseline's concurrency of a sweep)
    changed = [k for k in sorted(was) if was[k] != now.get(k, was[k])]
    diffs += [f"workload.{k}: baseline {was[k]!r}, candidate {now[k]!r}" for k in changed]
    missing = sorted(set(cand.get("arms", [])) - set(base.get("arms", [])))
    if missing:
        diffs.append(f"arms {missing} are not in the baseline")
    if diffs:
        raise InputError("incompatible baseline: " + "; ".join(diffs))


def save(runs: list[RunResult], path: Path) -> Path:
    fig = figures.of_runs(runs)
    rng = np.random.default_rng(0)
    groups = []
    for (arm, phase, length, rate), metrics in sorted(
        fig.samples.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0, kv[0][3] or 0.0)
    ):
        entry: dict[str, Any] = {
            "arm": arm,
            "phase": phase,
            "length": length,
            "rate": rate,
            "errors": fig.errors[(arm, phase, length, rate)],
        }
        for m, x in metrics.items():
            if len(x) == 0:
                continue
            kept = np.sort(rng.choice(x, MAX_SAMPLES, replace=False)) if len(x) > MAX_SAMPLES else np.sort(x)
            d = stats.describe(x)
            entry[m] = {
                "count": d["count"],
                "mean": d["mean"],
                "p50": d["p50"],
                "p99": d["p99"],
                "samples": [round(float(v), 7) for v in kept],
            }
        groups.append(entry)
    first = runs[0].meta
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": "kvbench-baseline",
        "created": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "kvbench": __version__,
        "identity": identity(runs),
        "runs": sorted({str(r.meta.get("run_id")) for r in runs}),
        "endpoint": first.get("endpoint"),
        "model": first.get("model"),
        "emulated": first.get("emulated"),
        "client": first.get("client"),
        "groups": groups,
        "run_values": [
            {"arm": a, "metric": m, "length": n, "rate": r, "values": v}
            for (a, m, n, r), v in sorted(
                fig.run_values.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0, kv[0][3] or 0.0)
            )
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(doc, indent=1) + "\n")
    return path


def load(path: Path) -> tuple[dict[str, Any], Figures]:
    text = read_input(path, "baseline file")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise InputError(f"{path}: not a readable baseline: {e}") from None
    if not isinstance(doc, dict) or doc.get("kind") != "kvbench-baseline":
        raise InputError(f"{path}: not a kvbench baseline (make one with `kvbench baseline save`)")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"{path}: baseline schema_version {doc.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    fig = Figures()
    for g in doc["groups"]:
        key = (g["arm"], g["phase"], g["length"], g.get("rate"))  # no rate: a baseline from before open loops
        fig.samples[key] = {m: np.array(g[m]["samples"], dtype=float) for m in stats.PER_REQUEST if m in g}
        fig.errors[key] = (int(g["errors"][0]), int(g["errors"][1]))
    for rv in doc["run_values"]:
        fig.run_values[(rv["arm"], rv["metric"], rv["length"], rv.get("rate"))] = [float(v) for v in rv["values"]]
    return doc, fig
