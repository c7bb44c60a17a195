"""Dynamo's offline replay of a sized configuration, beside kvbench's own simulation (`kvbench
size --dynamo`): `dynamo.replay.run_trace_replay`, its mocker engines, KV router and vLLM-like
scheduler in virtual time, run in the Python engines/dynamo/install.sh set up (Dynamo is not
kvbench's dependency: a process of its own, its one JSON line read back).

It is given what kvbench sizes: the same requests (a Mooncake trace of their arrivals, lengths
and block ids), the same workers, routing, G1 and G2 per worker, and the same times (the cost
model as the profile `[engine] timing` writes for a live mocker). It models less than kvbench
does, so a configuration it cannot model is said to be so, with why (`why_not`), and it is
slower (100,000 requests on 64 workers took 60 s round-robin, 109 s with its KV router: the issue
that asked for it), so it replays at most MAX_REQUESTS. Where it and kvbench's simulation part
by design, docs/sizing.md says."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness.config.engines import MockerTiming
from harness.engines.dynamo import VERSION, write_profile
from harness.sizing.fleet import Plan, Workload

MAX_REQUESTS = 100_000
TIMEOUT_S = 900.0  # a replay of MAX_REQUESTS with the KV router took 109 s here
ROUTERS = {"round_robin": "round_robin", "kv_router": "kv_router"}  # kvbench's routing -> Dynamo's router_mode
WHAT = (
    f"NVIDIA Dynamo {VERSION}'s offline replay (dynamo.replay.run_trace_replay: its mocker engines, router and "
    "scheduler in virtual time), given the same requests, workers, routing, G1/G2 and times"
)
# Run in Dynamo's Python with one argument, a JSON object of the replay's inputs; prints one JSON
# line: the share of prompt tokens found cached when each request was first admitted, the prompt
# tokens it counted, and its TTFT quantiles (s)
SCRIPT = """
import json, sys
from dynamo.replay import run_trace_replay
a = json.loads(sys.argv[1])
s = run_trace_replay(
    a["trace"], num_workers=a["workers"], router_mode=a["router"], trace_format="mooncake",
    trace_block_size=a["block"], extra_engine_args={"engine": a["engine"]},
).summary
print(json.dumps({
    "cached_share": s["first_admission_prefix_cache_reused_ratio"],
    "prompt_tokens": s["total_input_tokens"],
    "ttft_s": {k: s[f"{k}_ttft_ms"] / 1000 for k in ("mean", "median", "p99")},
}))
"""


def why_not(workload: object, plan: Plan) -> str | None:
    """Why Dynamo's replay cannot model this configuration as kvbench sizes it, or None."""
    if not isinstance(workload, Workload):
        return "a scenario's plan: its arrivals wait for the simulation's answers, which the replay does not take"
    if workload.refs.requests > MAX_REQUESTS:
        return f"{workload.refs.requests:,} requests: the replay is run for at most {MAX_REQUESTS:,}"
    if plan.routing not in ROUTERS:
        return f'routing "{plan.routing}": Dynamo has round-robin and its KV router'
    names = [t.name for t in plan.tiers]
    if names not in (["G1"], ["G1", "G2"]) or any(t.scope != "worker" for t in plan.tiers):
        return "its tiers: Dynamo's mocker has a G1 and a G2 per worker, no tier per node or shared"
    g1 = plan.tiers[0]
    if g1.timing.bandwidth is not None or g1.timing.latency_s or (len(names) > 1 and plan.tiers[1].timing.latency_s):
        return "a latency, or a G1 read bandwidth: the mocker's G1 is free and its G2 has a bandwidth only"
    if len(names) > 1 and plan.tiers[1].timing.bandwidth is None:
        return "a free G2: the mocker moves G2's blocks at a bandwidth"
    return None


def mooncake_lines(w: Workload) -> list[str]:
    """The requests as Dynamo's Mooncake reader takes them: arrival in ms, prompt and output
    lengths (at least one output token: the mocker answers with one), and a block id for each
    block the prompt touches, in order: kvbench's numbering of the trace's blocks, and an id of its
    own for a block kvbench keeps no reference of (a prompt's last, partial block: its tokens are
    the prompt's own, so no other request's block is the same)."""
    ids, fresh = w.refs.dense
    ends = np.cumsum(np.bincount(w.refs.request, minlength=w.refs.requests))
    lines = []
    for t, p, o, blocks in zip(w.arrival_s, w.prompt_tokens, w.output_tokens, np.split(ids, ends[:-1]), strict=True):
        need = -(-int(p) // w.block_tokens)
        own = blocks[:need].tolist()
        own += range(fresh, fresh + need - len(own))
        fresh += need - min(need, len(blocks))
        line = {"timestamp": round(float(t) * 1000, 3), "input_length": int(p), "output_length": max(int(o), 1)}
        lines.append(json.dumps({**line, "hash_ids": own}))
    return lines


def replay(py: Path, w: Workload, plan: Plan) -> dict[str, Any]:
    """Dynamo's replay of the configuration (`why_not` None): its figures, or the error it gave."""
    block = w.block_tokens
    longest = int(w.prompt_tokens.max()) + int(w.output_tokens.max()) + 1
    context = -(-longest // block) * block
    cost = plan.cost
    engine: dict[str, Any] = {
        "block_size": block,
        "num_gpu_blocks": plan.tiers[0].capacity_blocks,
        "max_model_len": context,
        "enable_prefix_caching": True,
        "kv_cache_bytes_per_token": int(plan.kv_bytes_per_token),
    }
    if len(plan.tiers) > 1:
        gbps = (plan.tiers[1].timing.bandwidth or 0.0) / 1e9
        engine["native_host_offload"] = {
            "num_host_blocks": plan.tiers[1].capacity_blocks,
            "h2d_bandwidth_gbps": gbps,
            "d2h_bandwidth_gbps": gbps,  # (its writes to G2 at the read bandwidth: kvbench's tiers have none)
        }
    with tempfile.TemporaryDirectory(prefix="kvbench-replay-") as tmp:
        trace = Path(tmp) / "trace.jsonl"
        trace.write_text("\n".join(mooncake_lines(w)) + "\n", encoding="utf-8")
        timing = MockerTiming(cost.prefill_a, cost.prefill_b, cost.decode_s)
        profile = write_profile(timing, Path(tmp) / "timing.npz", context, block)
        engine["timing_model"] = {"type": "external", "provider": "dynamo_profile", "config": {"path": str(profile)}}
        args = {
            "trace": str(trace),
            "workers": plan.fleet.workers,
            "router": ROUTERS[plan.routing],
            "block": block,
            "engine": engine,
        }
        started = time.monotonic()
        try:
            got = subprocess.run(
                [str(py), "-c", SCRIPT, json.dumps(args)], capture_output=True, text=True, timeout=TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            return {"error": f"the replay took over {TIMEOUT_S:.0f} s"}
        except OSError as e:
            return {"error": f"{py}: {e}"}
    took = time.monotonic() - started
    lines = got.stdout.strip().splitlines()
    if got.returncode != 0 or not lines:
        return {"error": f"the replay exited {got.returncode}: {got.stderr.strip()[-500:]}"}
    try:
        figures = json.loads(lines[-1])
        ttft = figures["ttft_s"]
        return {
            "cached_share": float(figures["cached_share"]),
            "prompt_tokens": int(figures["prompt_tokens"]),
            "ttft_s": {"mean": float(ttft["mean"]), "p50": float(ttft["median"]), "p99": float(ttft["p99"])},
            "seconds": round(took, 3),
        }
    except (ValueError, KeyError, TypeError) as e:
        return {"error": f"the replay's output was not what kvbench reads ({e!r}): {lines[-1][:200]}"}
