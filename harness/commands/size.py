"""`kvbench size SIZING.toml`: a fleet's KV tiers sized from a request trace, or from a result
folder's requests, in simulation (harness/sizing; docs/sizing.md). Reads the file
(sizing/config.py), resolves the engine's timing and the model's KV bytes per token (an emulator
profile's, or the numbers given), reads the trace (or the result folder's records:
sizing/recorded.py), and writes `sizing.json` into a result folder of its own: the inputs as
resolved, and every figure (sizing/fleet.py), marked simulated, with a row per request of each
configuration (requests.csv.gz). The terminal gets the figures a storage architect reads first."""

from __future__ import annotations

import collections
import contextlib
import csv
import functools
import gzip
import json
import multiprocessing
import signal
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from harness.core.children import die_with_parent
from harness.core.errors import EndpointError, InputError, replaced, signals_held
from harness.core.units import human_bandwidth, human_size
from harness.engines import replay
from harness.gate.rules import parse_rules
from harness.inputs import traces
from harness.results import utc_stamp, versions
from harness.sizing import config, planned, recorded, result
from harness.sizing.fleet import (
    CAPACITY_STEPS,
    Plan,
    Sized,
    TierPlan,
    Workload,
    baseline,
    baseline_key,
    from_columns,
    from_trace,
    placement,
    placement_key,
    size,
)
from harness.sizing.planned import Dependent
from harness.sizing.shared import Files, Handle, Here, Kept, Store
from harness.sizing.simulate import CLOCK_SPAN_S, Cost, Tier
from harness.sizing.stack import TraceColumns
from harness.sizing.tiers import Fleet

WHAT = (
    "Simulated, not measured: the workload's requests (a trace's, a result folder's, or a scenario's plan, "
    "its arrivals settled with the simulated answers where they wait for them) replayed in "
    "virtual time through the tiers configured (LRU each, inclusive, write-through; requests routed "
    "as `cluster.routing` says), each tier's bandwidth shared by the loads it serves at once, prefill "
    "and decode by the engine's cost model."
)
SIMULATED_BY = "kvbench's own simulation (harness/sizing/): every figure, but a configuration's dynamo_replay"


def main(
    file: Path,
    out: Path,
    console: Console,
    processes: int = 1,
    requests: bool | None = None,
    ray: str | None = None,
    dynamo: bool = False,
) -> int:
    """`requests`: write a row per request of each configuration (True), not (False), or when
    there are at most MAX_REQUEST_ROWS of them (None). `ray`: the address of a Ray cluster whose
    nodes size the configurations (`processes` of them at a time) instead of this host.
    `dynamo`: each configuration Dynamo's offline replay models replayed by it too, beside
    (engines/replay.py)."""
    spec = config.read(file)
    replayer = None
    if dynamo:
        from harness.engines import dynamo as engine

        replayer = engine.python()
        if replayer is None:
            raise EndpointError(
                "--dynamo: Dynamo is not installed here: run engines/dynamo/install.sh (or set KVBENCH_DYNAMO_PYTHON "
                "to a Python that has ai-dynamo)"
            )
    if spec.gate is not None:
        parse_rules(spec.gate, str(file))  # refused now, not after the sizing
    if processes < 1:
        raise InputError(f"--workers: expected a number of processes >= 1, got {processes}")
    with contextlib.ExitStack() as stack:
        if ray is not None:
            from harness.distributed import raypool

            raypool.require()
            console.print(f"Joining the Ray cluster at {ray} ...", markup=False)
            stack.enter_context(raypool.joined_now(ray))
        return _main(spec, file, out, console, processes, requests, ray, replayer)


def _main(
    spec: config.SizingSpec,
    file: Path,
    out: Path,
    console: Console,
    processes: int,
    requests: bool | None,
    ray: str | None,
    replayer: Path | None = None,
) -> int:
    cost, kv, source = _engine(spec)
    workload, where = _workload(spec, console)
    configurations = spec.configurations()
    plans = [_plan(spec, c, workload.block_tokens * kv, kv, cost) for c in configurations]
    doc: dict[str, Any] = {
        "kind": "sizing",
        "simulated": True,
        "what": WHAT,
        "status": "running",
        **versions(),
        "created": utc_stamp(datetime.now(UTC)),
        "file": str(file),
        "name": spec.name,
        **where,
        "rate_scale": spec.workload.rate_scale,
        "tenants": spec.workload.tenants,
        "cluster": {"workers_per_node": spec.workers_per_node, "routing": spec.routing},
        "model": {"kv_bytes_per_token": kv},
        "engine": {"source": source, **vars(cost)},
        "swept": sorted({k for c in configurations for k, _ in c.swept}),
        "bandwidth_bin_s": spec.bandwidth_bin_s,  # as asked: a configuration's figures say what it used
        "gate": spec.gate,
        "sized_by": {"processes": processes, "ray": ray},  # where: this host, or a Ray cluster's nodes
        # which engine simulated what: every figure kvbench's, but a configuration's `dynamo_replay`
        "engines": {"kvbench": SIMULATED_BY, **({"dynamo_replay": replay.WHAT} if replayer else {})},
        "configurations": [],
    }
    folder = out / spec.name / f"{doc['created']}-size"
    folder.mkdir(parents=True, exist_ok=True)
    console.print(_starting(spec, workload.refs.requests, len(configurations), processes), markup=False)
    rows = workload.refs.requests * len(configurations)
    keep = requests if requests is not None else rows <= MAX_REQUEST_ROWS
    doc["requests_file"] = result.REQUESTS if keep else None
    if requests is None and not keep:
        console.print(
            f"{rows:,} request rows (more than {MAX_REQUEST_ROWS:,}) are not written: --requests writes them",
            markup=False,
        )
    done = 0
    try:
        with (
            (folder / CONFIGURATIONS_JSONL).open("w", encoding="utf-8") as f,
            _rows_to(folder / result.REQUESTS if keep else None) as put_rows,
        ):
            for i, sized in each_sized(workload, plans, processes, keep, ray is not None):
                one = {"index": i, **_configuration(configurations[i], plans[i], sized.figures)}
                said = None
                if replayer is not None:
                    one["dynamo_replay"], said = _replayed(replayer, workload, plans[i], sized.figures)
                with signals_held():  # its rows and its line whole, or neither begun
                    put_rows(i, sized)  # first: a configuration said done has all its rows
                    f.write(json.dumps(one, default=str) + "\n")
                    f.flush()
                done += 1
                if len(configurations) > 1:
                    console.print(f"  {done}/{len(configurations)}: {_label(configurations[i])}", markup=False)
                if said is not None:
                    console.print(f"    {said}", markup=False)
        doc["status"] = "completed"
    except BaseException as e:  # what was sized is kept, and said to be all there is
        doc["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        raise
    finally:
        # what configurations.jsonl holds, a whole line each: sizing.json says the same wherever a
        # signal fell (a line written and flushed is done; one cut short is not)
        doc["configurations"] = _written(folder / CONFIGURATIONS_JSONL)
        _write(folder, doc)
    show(doc, console)
    console.print(f"Results: {folder}", markup=False)
    return 0


def _starting(spec: config.SizingSpec, n: int, configurations: int, processes: int) -> str:
    """The line that says what is being sized."""
    many = f"{configurations} configurations" + (f" in {processes} processes" if processes > 1 else "")
    return (
        f"Sizing {n:,} requests of {spec.workload.source}"
        + (f" ({spec.workload.tenants} tenants)" if spec.workload.tenants > 1 else "")
        + ": "
        + (many if configurations > 1 else f"{spec.workers[0]} workers, {len(spec.tiers)} tier(s)")
        + " ..."
    )


def _workload(spec: config.SizingSpec, console: Console) -> tuple[Workload | Dependent, dict[str, Any]]:
    """The requests sized, and sizing.json's account of where they came from: `trace` (the file,
    its format), `result` (the folder, the arm, its kind, which clock the arrivals are on, what
    was left out) or `scenario` (the file, its kind, what its plan leaves out)."""
    w = spec.workload
    if w.scenario is not None:
        slo_from = spec.file if spec.slo_ttft_s is not None else None
        sc = planned.read(w.scenario, w.block_tokens or config.RESULT_BLOCK_TOKENS, w.rate_scale, slo_from)
        # (the fewest seconds the plan can span: each request taking none; the answers only add)
        _within_the_clock(planned.arrivals(sc.plan, np.zeros(sc.plan.refs.requests)), spec, "at least ")
        if sc.note:
            console.print(f"note: the {sc.kind} plan: {sc.note}", markup=False)
        said = {"path": str(w.scenario), "kind": sc.kind, "block_tokens": sc.plan.block_tokens, "note": sc.note}
        return sc.plan, {"scenario": {**said, "requests": sc.plan.refs.requests}}
    if w.result is None:
        assert w.trace is not None  # (config.read: one of the three)
        # (a line at a time into columns: a 10^7-line trace's requests as objects took over 10 GB)
        reading = traces.Reading(w.trace, w.format, w.block_tokens)
        columns = TraceColumns.of(reading.requests())
        if not columns.requests:
            raise InputError(f"{w.trace}: the trace has no requests")
        if (misfits := reading.misfit_warning()) is not None:
            console.print(f"warning: {misfits}", markup=False)
        where = {
            "path": str(w.trace),
            "format": reading.format,
            "block_tokens": reading.block,
            "misfit_lines": reading.misfit_lines,
        }
        return _on_the_clock(from_columns(columns, reading.block, w.rate_scale, w.tenants), spec), {"trace": where}
    block = w.block_tokens or config.RESULT_BLOCK_TOKENS
    got = recorded.read(w.result, w.arm, block)
    if not got.requests:
        raise InputError(f"{got.folder}: no request with a prompt length to replay")
    said = {
        "path": str(got.folder),
        "arm": got.arm,
        "kind": got.kind,
        "status": got.status,
        "block_tokens": block,
        "arrivals": got.arrivals,
        "requests": len(got.requests),
        "left_out": got.left_out,
        "damaged_lines": len(got.skipped),
    }
    for warning in _result_warnings(got):
        console.print(f"warning: {warning}", markup=False)
    return _on_the_clock(from_trace(got.requests, block, w.rate_scale, w.tenants), spec), {"result": said}


def _on_the_clock(w: Workload, spec: config.SizingSpec) -> Workload:
    """`w`, refused where its arrivals (after rate_scale) span more than the simulation's clock
    can time (simulate.CLOCK_SPAN_S): past it a prefill's fraction of a second is lost in rounding."""
    _within_the_clock(w.arrival_s, spec, "")
    return w


def _within_the_clock(arrival_s: np.ndarray, spec: config.SizingSpec, least: str) -> None:
    """InputError naming workload.rate_scale where `arrival_s` spans more than CLOCK_SPAN_S
    (`least`: "at least " where these are the fewest seconds they can span)."""
    span = float(arrival_s.max() - arrival_s.min()) if len(arrival_s) else 0.0
    if not span <= CLOCK_SPAN_S:  # (inf and NaN too)
        raise InputError(
            f"{spec.file}: workload.rate_scale: expected arrivals over at most {CLOCK_SPAN_S:.0e} s (the "
            f"simulation's clock keeps fractions of a microsecond up to there); at rate_scale "
            f"{spec.workload.rate_scale:g} they span {least}{span:.3g} s"
        )


def _result_warnings(got: recorded.Recorded) -> list[str]:
    out = []
    if got.status != "completed":
        out.append(f"{got.folder}: the run is {got.status}: its {len(got.requests):,} requests are replayed")
    if got.left_out:
        out.append(f"{got.left_out:,} records without a prompt length were left out")
    if got.skipped:
        out.append(f"{len(got.skipped):,} damaged lines of requests.jsonl were left out: {got.skipped[0]}")
    if got.arrivals == recorded.SENT:
        out.append(
            f"a {got.kind} run has no schedule: its requests arrive when they were sent, the load the "
            "measured server let it offer"
        )
    return out


def _written(path: Path) -> list[dict[str, Any]]:
    """The configurations whose line configurations.jsonl holds whole, by index."""
    if not path.is_file():
        return []
    out = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                out.append(json.loads(line))
    return sorted(out, key=lambda c: int(c["index"]))


# Each configuration's figures, one line as each is done (a long sweep interrupted keeps them)
CONFIGURATIONS_JSONL = "configurations.jsonl"
# Request rows (result.REQUESTS: fleet.row_columns after `configuration`, its index in
# configurations.jsonl) are appended as each configuration is done, gzip level 1. Past this many
# (requests x configurations) they are written only when asked (--requests): a sweep of 16
# configurations of 10^7 requests would write some 10 GB
MAX_REQUEST_ROWS = 10_000_000


@contextlib.contextmanager
def _rows_to(path: Path | None) -> Iterator[Callable[[int, Sized], None]]:
    """A writer of each configuration's request rows to `path` (none: rows are dropped)."""
    if path is None:
        yield lambda _i, _sized: None
        return
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=1, newline="") as f:
        yield functools.partial(_put_rows, f, [True])


def _put_rows(f: IO[str], first: list[bool], i: int, sized: Sized) -> None:
    import pandas as pd

    frame = pd.DataFrame({"configuration": i, **sized.rows})
    frame.to_csv(f, header=first[0], index=False, float_format="%.9g")
    first[0] = False


def _plan(spec: config.SizingSpec, c: config.Configuration, block_bytes: int, kv: int, cost: Cost) -> Plan:
    return Plan(
        Fleet(c.workers, spec.workers_per_node),
        tuple(
            TierPlan(
                t.name,
                t.scope,
                t.capacity_bytes // block_bytes,
                Tier(t.latency_s, t.read_bandwidth, t.writes),
            )
            for t in c.tiers
        ),
        kv,
        cost,
        spec.slo_ttft_s,
        spec.slo_share,
        spec.bandwidth_bin_s,
        spec.routing,
    )


def each_sized(
    workload: Workload | Dependent, plans: list[Plan], processes: int, rows: bool, on_ray: bool = False
) -> Iterator[tuple[int, Sized]]:
    """Each plan sized (its index, as each is done; its request rows only if `rows`): in this
    process, in `processes` processes (spawned: nothing of this one's state is copied into them
    but what they are given), or in `processes` of the joined Ray cluster's (`on_ray`: Ray's
    multiprocessing pool, its actors on the cluster's nodes). What several configurations share
    is computed once: each distinct Placement (routes and stack distances) and Baseline (every
    prompt recomputed), first, then the configurations, each with its own (a kind's plan shares
    none: its arrivals settle with each configuration's answers). Stopped (Ctrl-C,
    SIGTERM, an error), the processes are terminated at once, not left to finish their
    configuration; and local ones end with kvbench if it is killed."""
    if not on_ray and (processes == 1 or len(plans) == 1):
        yield from _in_turn(workload, plans, rows)
        return
    n = min(processes, len(plans))
    _ = workload.refs.dense  # numbered here once (cached, handed over with it), not in every process
    clustered = {placement_key(p) for p in plans if any(t.scope == "cluster" for t in p.tiers)}
    if isinstance(workload, Workload) and len(clustered) > 1:
        _ = workload.refs.distances  # a cluster tier's, the same in every Placement: once, handed over
    with contextlib.ExitStack() as stack:
        store: Store
        if on_ray:
            from harness.distributed import raypool

            pool, store = raypool.process_pool(n), raypool.ObjectStore()
        else:
            pool = multiprocessing.get_context("spawn").Pool(n, initializer=_child)
            # (its files removed once the pool has stopped)
            store = Files(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvbench-size-"))))
        try:
            given = store.put(workload)
            shared = {k: plan for plan in plans for k in _shared_keys(workload, plan)}
            tasks = [(k, given, plan, store) for k, plan in shared.items()]
            handles = dict(pool.imap_unordered(_share_one, tasks))
            yield from pool.imap_unordered(
                _size_one,
                [
                    (i, given, plan, tuple(handles[k] for k in _shared_keys(workload, plan)), rows)
                    for i, plan in enumerate(plans)
                ],
            )
            pool.close()
        finally:
            pool.terminate()
            pool.join()


def _shared_keys(workload: Workload | Dependent, plan: Plan) -> tuple[tuple[Any, ...], ...]:
    """The keys of what a plan may share with others: its Placement's, its Baseline's; none for a
    kind's plan (its arrivals are each configuration's own)."""
    if isinstance(workload, Dependent):
        return ()
    return ("placement", *placement_key(plan)), ("baseline", *baseline_key(plan))


def _in_turn(workload: Workload | Dependent, plans: list[Plan], rows: bool) -> Iterator[tuple[int, Sized]]:
    """Each plan sized in this process, those of one Placement one after the other, each Placement
    and Baseline computed once and dropped after the last plan that needs it."""
    keys = [_shared_keys(workload, plan) for plan in plans]
    first: dict[tuple[Any, ...], int] = {}
    for i, key in enumerate(keys):
        first.setdefault(key[:1], i)
    left = collections.Counter(k for pair in keys for k in pair)
    held: dict[tuple[Any, ...], Handle] = {}
    for i in sorted(range(len(plans)), key=lambda i: first[keys[i][:1]]):
        for k in keys[i]:
            if k not in held:
                held[k] = _share_one((k, Kept(workload), plans[i], Here()))[1]
        yield _size_one((i, Kept(workload), plans[i], tuple(held[k] for k in keys[i]), rows))
        for k in keys[i]:
            left[k] -= 1
            if not left[k]:
                del held[k]


def _child() -> None:
    """A sizing process: Ctrl-C is kvbench's to handle (it stops the processes), and the process
    ends with kvbench even when kvbench is killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


def _share_one(task: tuple[tuple[Any, ...], Handle, Plan, Store]) -> tuple[tuple[Any, ...], Handle]:
    """What the plan shares under the key (its Placement, or its Baseline), computed and put into
    the store."""
    key, given, plan, store = task
    w = given.load()
    return key, store.put(placement(w, plan) if key[0] == "placement" else baseline(w, plan))


def _size_one(task: tuple[int, Handle, Plan, tuple[Handle, ...], bool]) -> tuple[int, Sized]:
    """One plan sized from its workload, and its Placement and Baseline where handed over; its
    rows dropped where they are not wanted (not carried back from a process: a configuration of
    10^7 requests has about 1 GB of them)."""
    i, given, plan, shared, rows = task
    placed, base = (h.load() for h in shared) if shared else (None, None)
    sized = size(given.load(), plan, placed, base)
    return i, sized if rows else Sized(sized.figures, {})


def _replayed(
    py: Path, workload: Workload | Dependent, plan: Plan, figures: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """Dynamo's replay of one configuration (`--dynamo`), or why it was not replayed; and a line
    for the terminal, beside kvbench's own figures."""
    why = replay.why_not(workload, plan)
    if why is not None:
        return {"not_modelled": why}, f"Dynamo's replay: not modelled ({why})"
    assert isinstance(workload, Workload)
    got = replay.replay(py, workload, plan)
    if "error" in got:
        return got, f"warning: Dynamo's replay failed: {got['error']}"
    share = sum(t["share"] for t in figures["tiers"])
    return got, (
        f"Dynamo's replay: cached {got['cached_share']:.1%} (kvbench {share:.1%}), TTFT p50 "
        f"{got['ttft_s']['p50']:.4g} s (kvbench {figures['ttft_s']['p50']:.4g} s), p99 {got['ttft_s']['p99']:.4g} s "
        f"(kvbench {figures['ttft_s']['p99']:.4g} s)"
    )


def _configuration(c: config.Configuration, plan: Plan, figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "swept": dict(c.swept),
        "workers": c.workers,
        "tiers": [{**vars(t), "capacity_blocks": p.capacity_blocks} for t, p in zip(c.tiers, plan.tiers, strict=True)],
        "figures": figures,
    }


def _write(folder: Path, doc: dict[str, Any]) -> None:
    with replaced(folder / "sizing.json") as tmp:
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    with replaced(folder / "configurations.csv") as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        rows = [result.row(c) for c in doc["configurations"]]
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["workers"])
        writer.writeheader()
        writer.writerows(rows)


def _label(c: config.Configuration) -> str:
    return ", ".join(f"{k} {result.value(k, v)}" for k, v in c.swept) or "the configuration"


def _engine(spec: config.SizingSpec) -> tuple[Cost, int, str]:
    """The cost model, the KV bytes per token, and where they came from."""
    e = spec.engine
    a, b, d, kv = e.prefill_a, e.prefill_b, e.decode_s_per_token, spec.kv_bytes_per_token
    source = "given"
    if e.fit_from is not None:
        fit = recorded.fitted_cost(e.fit_from)
        a, b = (fit.prefill_a if a is None else a), (fit.prefill_b if b is None else b)
        d = fit.decode_s_per_token if d is None else d
        kv = fit.kv_bytes_per_token if kv is None else kv
        given = [k for k in ("prefill_a", "prefill_b", "decode_s_per_token") if getattr(e, k) is not None]
        source = fit.said + (f"; {', '.join(given)} as given" if given else "")
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
    console.print(f"[bold]{doc['name']}[/]: {doc['what']}", highlight=False)
    configurations = doc["configurations"]
    if len(configurations) == 1:
        _one(configurations[0], console)
    elif configurations:
        _sweep(doc, console)
    for line in result.warnings(doc):
        console.print(f"warning: {line}", markup=False)


def _one(c: dict[str, Any], console: Console) -> None:
    f = c["figures"]
    t = Table(
        "tier", "scope", "instances", "capacity", "share of prompt tokens", "read mean", "read p99", "write p99", "knee"
    )
    for tier, spec in zip(f["tiers"], c["tiers"], strict=True):
        bw = tier["read_bytes_per_s"]
        knee = result.knee_bytes(spec, tier)
        t.add_row(
            tier["name"],
            tier["scope"],
            str(tier["instances"]),
            human_size(spec["capacity_bytes"]),
            f"{tier['share']:.1%}",
            "free" if bw["mean"] is None else human_bandwidth(bw["mean"]),
            human_bandwidth(bw["p99"]),
            human_bandwidth(tier["write_bytes_per_s"]["p99"]),
            "-" if knee is None else human_size(knee),
        )
    Console(file=console.file, width=max(120, console.width)).print(t)  # (a row a line)
    ttft, r = f["ttft_s"], f["recompute_ttft_s"]
    console.print(
        f"TTFT p50 {ttft['p50']:.3f} s, p99 {ttft['p99']:.3f} s (recomputing every prompt: p50 {r['p50']:.3f} s, "
        f"p99 {r['p99']:.3f} s); prefill GPU-seconds {f['prefill_gpu_s']:,.0f} against "
        f"{f['recompute_prefill_gpu_s']:,.0f}",
        markup=False,
    )
    if (slo := f["slo"]) is not None:
        cached, recompute = slo["cached"], slo["recompute"]
        console.print(
            f"Within the TTFT SLO of {slo['ttft_s']:g} s at the workload's rate: {cached['within']:.1%} of requests "
            f"({recompute['within']:.1%} recomputing every prompt). SLO capacity ({slo['share']:.0%} within it): "
            f"{_speedup(cached['capacity_speedup'])} the workload's rate, against "
            f"{_speedup(recompute['capacity_speedup'])} recomputing"
            + (f": {slo['capacity_ratio']:.2f}x" if slo["capacity_ratio"] is not None else "")
            + (" at least" if (cached["capacity_speedup"] or 0) >= 2**CAPACITY_STEPS else ""),
            markup=False,
        )


def _sweep(doc: dict[str, Any], console: Console) -> None:
    """One row per configuration: what was swept, each tier's share and read p99, TTFT and the SLO."""
    configurations = doc["configurations"]
    names = [t["name"] for t in configurations[0]["tiers"]]
    slo = configurations[0]["figures"]["slo"] is not None
    t = Table(
        *doc["swept"],
        *(f"{n} share" for n in names),
        *(f"{n} read p99" for n in names),
        *(f"{n} write p99" for n in names),
        "TTFT p50",
        "TTFT p99",
        *(("within SLO", "SLO capacity vs recompute") if slo else ()),
    )
    for c in configurations:
        f = c["figures"]
        cells = [result.value(k, c["swept"].get(k)) for k in doc["swept"]]
        cells += [f"{x['share']:.1%}" for x in f["tiers"]]
        cells += [human_bandwidth(x["read_bytes_per_s"]["p99"]) for x in f["tiers"]]
        cells += [human_bandwidth(x["write_bytes_per_s"]["p99"]) for x in f["tiers"]]
        cells += [f"{f['ttft_s']['p50']:.3f} s", f"{f['ttft_s']['p99']:.3f} s"]
        if slo:
            s = f["slo"]
            ratio = s["capacity_ratio"]
            ceiling = (s["cached"]["capacity_speedup"] or 0) >= 2**CAPACITY_STEPS  # the search's highest
            cells += [
                f"{s['cached']['within']:.1%}",
                "-" if ratio is None else ("at least " if ceiling else "") + f"{ratio:.2f}x",
            ]
        t.add_row(*cells)
    Console(file=console.file, width=max(220, console.width)).print(t)  # (as the gate's: a row a line)
    r = configurations[0]["figures"]["recompute_ttft_s"]
    console.print(
        f"Recomputing every prompt: TTFT p50 {r['p50']:.3f} s, p99 {r['p99']:.3f} s"
        + (" (on the first configuration's workers)" if "workers" in doc["swept"] else ""),
        markup=False,
    )


def _speedup(x: float | None) -> str:
    if x is None:
        return f"not even 1/{2**CAPACITY_STEPS:,} of"
    if x >= 2**CAPACITY_STEPS:  # the search stops there: the capacity is at least that
        return f"at least {x:,.0f}x (the highest speed-up tried)"
    return f"{x:.3g}x"
