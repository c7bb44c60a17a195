"""`kvbench size SIZING.toml`: a fleet's KV tiers sized from a request trace, in simulation
(harness/sizing; docs/sizing.md). Reads the file (sizing/config.py), resolves the engine's timing
and the model's KV bytes per token (an emulator profile's, or the numbers given), reads the trace,
and writes `sizing.json` into a result folder of its own: the inputs as resolved, and every figure
(sizing/fleet.py), marked simulated. The terminal gets the figures a storage architect reads
first."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.core.errors import InputError, replaced
from harness.core.units import human_bandwidth, human_size
from harness.inputs import traces
from harness.results import utc_stamp, versions
from harness.sizing import config
from harness.sizing.fleet import CAPACITY_STEPS, Plan, TierPlan, from_trace, size
from harness.sizing.simulate import Cost, Tier
from harness.sizing.tiers import Fleet

WHAT = (
    "Simulated, not measured: the trace's requests replayed in virtual time through the tiers "
    "configured (LRU each, inclusive, write-through; requests routed as `cluster.routing` says), each "
    "tier's bandwidth shared by the loads it serves at once, prefill and decode by the engine's cost model."
)


def main(file: Path, out: Path, console: Console) -> int:
    spec = config.read(file)
    cost, kv, source = _engine(spec)
    trace = traces.read(spec.workload.trace, spec.workload.format, spec.workload.block_tokens)
    if not trace.requests:
        raise InputError(f"{spec.workload.trace}: the trace has no requests")
    block_bytes = trace.block_tokens * kv
    plan = Plan(
        Fleet(spec.workers, spec.workers_per_node),
        tuple(
            TierPlan(t.name, t.scope, t.capacity_bytes // block_bytes, Tier(t.latency_s, t.read_bandwidth))
            for t in spec.tiers
        ),
        kv,
        cost,
        spec.slo_ttft_s,
        spec.slo_share,
        spec.bandwidth_bin_s,
        spec.routing,
    )
    console.print(
        f"Sizing {len(trace.requests):,} requests of {spec.workload.trace} on {spec.workers} workers "
        f"({len(spec.tiers)} tier(s)) ...",
        markup=False,
    )
    figures = size(from_trace(trace.requests, trace.block_tokens, spec.workload.rate_scale), plan)
    doc = {
        "kind": "sizing",
        "simulated": True,
        "what": WHAT,
        **versions(),
        "created": utc_stamp(datetime.now(UTC)),
        "file": str(file),
        "name": spec.name,
        "trace": {"path": str(spec.workload.trace), "format": trace.format, "block_tokens": trace.block_tokens},
        "rate_scale": spec.workload.rate_scale,
        "cluster": {"workers": spec.workers, "workers_per_node": spec.workers_per_node, "routing": spec.routing},
        "model": {"kv_bytes_per_token": kv},
        "engine": {"source": source, **vars(cost)},
        "tiers": [
            {**vars(t), "capacity_blocks": p.capacity_blocks} for t, p in zip(spec.tiers, plan.tiers, strict=True)
        ],
        "figures": figures,
    }
    folder = out / spec.name / f"{doc['created']}-size"
    folder.mkdir(parents=True, exist_ok=True)
    with replaced(folder / "sizing.json") as tmp:
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    show(doc, console)
    console.print(f"Results: {folder}", markup=False)
    return 0


def _engine(spec: config.SizingSpec) -> tuple[Cost, int, str]:
    """The cost model, the KV bytes per token, and where they came from."""
    e = spec.engine
    a, b, d, kv = e.prefill_a, e.prefill_b, e.decode_s_per_token, spec.kv_bytes_per_token
    source = "given"
    if e.profile is not None:
        from harness.emulator.profiles import profiles

        known = profiles()
        if e.profile not in known:
            raise InputError(
                f"{spec.file}: engine.profile: expected one of {', '.join(sorted(known))}, got {e.profile!r}"
            )
        p = known[e.profile]
        a, b, d = (p.prefill_a if a is None else a), (p.prefill_b if b is None else b), (p.itl_s if d is None else d)
        kv = p.kv_bytes_per_token if kv is None else kv
        source = f"emulator profile {e.profile} (calibrated as its description says: {p.description})"
    if kv is None:
        raise InputError(f"{spec.file}: model.kv_bytes_per_token: missing; expected the model's KV bytes per token")
    if a is None or b is None or d is None:  # config.read requires them without a profile
        raise InputError(f"{spec.file}: engine: expected prefill_a, prefill_b and decode_s_per_token, or a profile")
    return Cost(a, b, d), kv, source


def show(doc: dict[str, Any], console: Console) -> None:
    f = doc["figures"]
    console.print(f"[bold]{doc['name']}[/]: {doc['what']}", highlight=False)
    t = Table("tier", "scope", "instances", "capacity", "share of prompt tokens", "read mean", "read p99", "knee")
    for tier, spec in zip(f["tiers"], doc["tiers"], strict=True):
        bw = tier["read_bytes_per_s"]
        knee = tier["curve"]["knee_blocks"]
        block = spec["capacity_bytes"] / spec["capacity_blocks"] if spec["capacity_blocks"] else None
        t.add_row(
            tier["name"],
            tier["scope"],
            str(tier["instances"]),
            human_size(spec["capacity_bytes"]),
            f"{tier['share']:.1%}",
            "free" if bw["mean"] is None else human_bandwidth(bw["mean"]),
            human_bandwidth(bw["p99"]),
            "-" if knee is None or block is None else human_size(knee * block),
        )
    console.print(t)
    c, r = f["ttft_s"], f["recompute_ttft_s"]
    console.print(
        f"TTFT p50 {c['p50']:.3f} s, p99 {c['p99']:.3f} s (recomputing every prompt: p50 {r['p50']:.3f} s, "
        f"p99 {r['p99']:.3f} s); prefill GPU-seconds {f['prefill_gpu_s']:,.0f} against "
        f"{f['recompute_prefill_gpu_s']:,.0f}",
        markup=False,
    )
    if (slo := f["slo"]) is not None:
        cached, recompute = slo["cached"], slo["recompute"]
        console.print(
            f"Within the TTFT SLO of {slo['ttft_s']:g} s at the trace's rate: {cached['within']:.1%} of requests "
            f"({recompute['within']:.1%} recomputing every prompt). SLO capacity ({slo['share']:.0%} within it): "
            f"{_speedup(cached['capacity_speedup'])} the trace's rate, against "
            f"{_speedup(recompute['capacity_speedup'])} recomputing"
            + (f": {slo['capacity_ratio']:.2f}x" if slo["capacity_ratio"] is not None else "")
            + (" at least" if (cached["capacity_speedup"] or 0) >= 2**CAPACITY_STEPS else ""),
            markup=False,
        )


def _speedup(x: float | None) -> str:
    if x is None:
        return f"not even 1/{2**CAPACITY_STEPS:,} of"
    if x >= 2**CAPACITY_STEPS:  # the search stops there: the capacity is at least that
        return f"at least {x:,.0f}x (the highest speed-up tried)"
    return f"{x:.3g}x"
