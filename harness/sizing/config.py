"""`kvbench size`'s file, SIZING.toml (docs/sizing.md has every key): read strictly, as scenarios
are (config/tables.py: file, key, what was expected, did-you-mean), into frozen dataclasses.
Pure apart from reading the file; what the engine's profile gives is the command's to resolve
(an emulator profile's cost model and KV bytes per token).

    schema_version = 1
    name = "fleet-64"
    [workload]
    trace = "traces/mooncake.jsonl"   # Mooncake or Qwen-Bailian JSONL, relative to this file
    rate_scale = 4.0                  # arrivals this many times faster than the trace's
    tenants = 16                      # and replayed by 16 tenants that share no prefix
    [model]
    kv_bytes_per_token = 73728       # default: the engine profile's
    [cluster]
    workers = 64
    workers_per_node = 8
    [engine]
    profile = "redbooks-g4"          # or prefill_a, prefill_b, decode_s_per_token
    [[tiers]]
    name = "G1"
    scope = "worker"
    capacity = "16GiB"
    [[tiers]]
    name = "G4"
    scope = "cluster"
    capacity = "100TB"
    read_bandwidth = ["50GB/s", "100GB/s", "200GB/s"]   # a list is a sweep (workers and capacity too):
    latency_s = 0.001                                    # the configurations are the lists' product
    [slo]
    ttft_s = 2.0                      # and share = 0.9: a load holds it when 90 % of requests meet it
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from harness.config.scenario import TIER_NAMES, Slo
from harness.config.tables import Collect, Table, read_toml, size
from harness.core.errors import InputError
from harness.sizing.routing import ROUTINGS
from harness.sizing.simulate import WRITES
from harness.sizing.tiers import SCOPES

T = TypeVar("T")

SCHEMA_VERSION = 1
FORMATS = ("auto", "mooncake", "bailian")
# A sweep's bounds: values of one key, and configurations in all (each is a simulation of the
# whole trace: seconds to minutes)
MAX_SWEPT = 64
# A trace replayed by at most this many tenants (each a copy of its requests held in memory)
MAX_TENANTS = 4096
MAX_CONFIGURATIONS = 1024
# How finely each tier's read bandwidth is sampled over time for its p99 and max (s of the
# simulated clock).
BANDWIDTH_BIN_S = 1.0


# Where the requests come from: one of these [workload] keys
SOURCES = ("trace", "result", "scenario")
# A result folder's or a scenario's prompts cut into blocks of this many tokens unless `block_tokens` says
# otherwise: vLLM's default block size
RESULT_BLOCK_TOKENS = 16


@dataclass(frozen=True)
class WorkloadSpec:
    """The requests sized: a trace's (`trace`), a kvbench result folder's (`result`: a run
    folder, or a scenario's folder whose newest run's `arm` is replayed), or a scenario's plan
    (`scenario`: its workload kind's requests, not run)."""

    trace: Path | None
    format: str
    block_tokens: int | None  # default: the format's (512 Mooncake, 16 Bailian); else RESULT_BLOCK_TOKENS
    rate_scale: float
    tenants: int  # the requests replayed by this many independent tenants (fleet.scaled_up)
    result: Path | None = None
    arm: str | None = None
    scenario: Path | None = None  # a scenario file: its workload kind's plan, not run (sizing/planned.py)

    @property
    def source(self) -> Path:
        """The file or folder the requests come from."""
        found = self.trace or self.result or self.scenario
        assert found is not None  # (read: one of the three)
        return found


@dataclass(frozen=True)
class TierSpec:
    """One tier of one configuration."""

    name: str
    scope: str
    capacity_bytes: int
    read_bandwidth: float | None  # bytes/s of each instance; None: free (a GPU's own memory)
    latency_s: float
    writes: str = "behind"  # WRITES: on a path of their own, or through the read bandwidth (after or before)


@dataclass(frozen=True)
class TierChoices:
    """A [[tiers]] table: its capacity and read bandwidth one value each, or lists (a sweep)."""

    name: str
    scope: str
    capacities: tuple[int, ...]
    bandwidths: tuple[float | None, ...]
    latency_s: float
    writes: str = "behind"


@dataclass(frozen=True)
class Configuration:
    """One point of the sweep: a worker count and a value for each tier's capacity and bandwidth;
    `swept` names the values that vary across the sweep (key, value: workers, G4.capacity ...)."""

    workers: int
    tiers: tuple[TierSpec, ...]
    swept: tuple[tuple[str, float | None], ...]


@dataclass(frozen=True)
class EngineSpec:
    """The engine's timing: an emulator profile's (`profile`), one fitted to a kvbench TTFT
    sweep's result folder (`fit_from`), or the three numbers given (each given number overrides
    the profile's or the fit's)."""

    profile: str | None
    prefill_a: float | None
    prefill_b: float | None
    decode_s_per_token: float | None
    fit_from: Path | None = None


@dataclass(frozen=True)
class SizingSpec:
    file: Path
    name: str
    workload: WorkloadSpec
    kv_bytes_per_token: int | None  # default: the engine profile's
    workers: tuple[int, ...]  # more than one: a sweep
    workers_per_node: int
    routing: str
    engine: EngineSpec
    tiers: tuple[TierChoices, ...]
    slo_ttft_s: float | None
    slo_share: float
    bandwidth_bin_s: float
    gate: dict[str, Any] | None = None  # [gate]: thresholds on sizing.result.METRICS (gate/rules.py reads it)

    def configurations(self) -> list[Configuration]:
        """The sweep's points: the product of every list given, workers outermost, then each tier's
        capacities and bandwidths in the file's order."""
        axes: list[tuple[str, tuple[Any, ...]]] = [("workers", self.workers)]
        for t in self.tiers:
            axes += [(f"{t.name}.capacity", t.capacities), (f"{t.name}.read_bandwidth", t.bandwidths)]
        out = []
        for values in itertools.product(*(v for _, v in axes)):
            got = dict(zip((k for k, _ in axes), values, strict=True))
            tiers = tuple(
                TierSpec(
                    t.name, t.scope, got[f"{t.name}.capacity"], got[f"{t.name}.read_bandwidth"], t.latency_s, t.writes
                )
                for t in self.tiers
            )
            swept = tuple((k, got[k]) for k, v in axes if len(v) > 1)
            out.append(Configuration(got["workers"], tiers, swept))
        return out


def read(path: Path) -> SizingSpec:
    """SIZING.toml, or an InputError naming the file and key (each section's first mistake, all
    sections at once: config/tables.Collect)."""
    return parse(read_toml(path, "the sizing file"), path)


def parse(data: dict[str, Any], path: Path) -> SizingSpec:
    """A sizing file's TOML as read (`path`: where it came from, for errors and relative paths)."""
    top = Table(str(path), "", data)
    top.known(*SECTIONS)
    read = Collect(str(path))
    name = read(_head, top)
    workload = read(_workload, top.sub("workload"), path)
    kv = read(_model, top.sub("model"))
    cluster = top.sub("cluster")
    nodes = read(_cluster, cluster)
    engine = read(_engine, top.sub("engine"), path)
    tiers = read(_tiers, top, path)
    slo = read(_slo, top.sub("slo"))
    bin_s = read(top.number, "bandwidth_bin_s", BANDWIDTH_BIN_S, None, True)
    gate = read(_gate, top)
    read(top.done)
    read.check()
    assert name is not None and workload is not None and nodes is not None and engine is not None
    assert tiers is not None and slo is not None and bin_s is not None  # (read.check)
    workers, per_node, routing = nodes
    if routing != "round_robin" and not any(t.scope == "worker" for t in tiers):
        cluster.fail(
            "routing", 'expected a tier of scope = "worker" with it (the router matches the device cache)', routing
        )
    spec = SizingSpec(path, name, workload, kv, workers, per_node, routing, engine, tiers, *slo, bin_s, gate)
    n = math.prod(len(v) for v in (workers, *(x for t in tiers for x in (t.capacities, t.bandwidths))))
    if n > MAX_CONFIGURATIONS:
        raise InputError(
            f"{path}: the lists given make {n:,} configurations; expected at most {MAX_CONFIGURATIONS:,} "
            "(size a coarse sweep first, then a finer one around what it finds)"
        )
    return spec


# Every top-level key of a sizing file
SECTIONS = (
    "schema_version",
    "name",
    "workload",
    "model",
    "cluster",
    "engine",
    "tiers",
    "slo",
    "bandwidth_bin_s",
    "gate",
)


def _head(top: Table) -> str:
    version = top.integer("schema_version", required=True, what=f"the schema version ({SCHEMA_VERSION})")
    if version != SCHEMA_VERSION:
        top.fail("schema_version", f"expected {SCHEMA_VERSION}", version)
    name: str = top.text("name", required=True)
    if not name.strip() or "/" in name or name.startswith("."):
        top.fail("name", "expected a name for the result folder (no '/', not starting with '.')", name)
    return name


def _model(t: Table) -> int | None:
    kv = t.integer("kv_bytes_per_token", None, minimum=1, what="an integer number of bytes")
    t.done()
    return kv


def _cluster(t: Table) -> tuple[tuple[int, ...], int, str]:
    """workers (a sweep maybe), workers per node, routing; `done` is the caller's (routing is
    checked against the tiers)."""
    workers = _swept(
        t, "workers", lambda t, k: t.integer(k, required=True, minimum=1, what="an integer number of workers (GPUs)")
    )
    per_node = t.integer("workers_per_node", 1, minimum=1, what="an integer number of workers")
    if any(n % per_node for n in workers):
        t.fail("workers_per_node", f"expected a divisor of workers ({', '.join(map(str, workers))})", per_node)
    routing = t.text("routing", ROUTINGS[0], ROUTINGS)
    t.done()
    return workers, per_node, routing


def _slo(t: Table) -> tuple[float | None, float]:
    ttft = t.number("ttft_s", 0.0, positive=True) if t.has("ttft_s") else None
    share = t.number("share", Slo.share, positive=True, maximum=1.0)
    t.done()
    return ttft, share


def _gate(top: Table) -> dict[str, Any] | None:
    gate = top.get("gate")
    if gate is not None and not isinstance(gate, dict):
        top.fail("gate", "expected a table of rules ([gate.thresholds])", gate)
    return gate


def _workload(t: Table, path: Path) -> WorkloadSpec:
    given = [k for k in SOURCES if t.has(k)]
    if not given:
        t.required(
            "trace",
            "a Mooncake or Bailian JSONL file (trace), a kvbench result folder (result) or a scenario file whose "
            "plan to size (scenario)",
        )
    elif len(given) > 1:
        t.fail(given[1], f"expected one of {', '.join(SOURCES)}, not {' and '.join(given)}", t.get(given[1]))
    trace, result, planned = t.text("trace"), t.text("result"), t.text("scenario")
    if trace is None and t.has("format"):
        t.fail(
            "format",
            "expected format only with trace (a result's or a scenario's format is kvbench's)",
            t.get("format"),
        )
    if result is None and t.has("arm"):
        t.fail("arm", "expected arm only with result (the arm of a result folder to replay)", t.get("arm"))
    if planned is not None and t.has("tenants"):
        t.fail(
            "tenants",
            "expected tenants only with trace or result (a scenario's users are its own: raise them there)",
            t.get("tenants"),
        )
    fmt = t.text("format", "auto", FORMATS)
    block = t.integer("block_tokens", None, minimum=1, what="an integer number of tokens")
    scale = t.number("rate_scale", 1.0, positive=True)
    tenants = t.integer("tenants", 1, minimum=1, what="an integer number of tenants")
    if tenants > MAX_TENANTS:
        t.fail("tenants", f"expected at most {MAX_TENANTS:,} tenants", tenants)
    arm = t.text("arm") if result is not None else None
    t.done()
    return WorkloadSpec(
        _beside(path, trace), fmt, block, scale, tenants, _beside(path, result), arm, _beside(path, planned)
    )


def _beside(path: Path, name: str | None) -> Path | None:
    """A path the sizing file gives, relative to the file."""
    return None if name is None else (path.parent / name) if not Path(name).is_absolute() else Path(name)


def _engine(t: Table, path: Path) -> EngineSpec:
    profile, fit_from = t.text("profile"), t.text("fit_from")
    if profile is not None and fit_from is not None:
        t.fail("fit_from", "expected profile or fit_from, not both", fit_from)
    numbers = {k: t.number(k, 0.0, minimum=0.0) if t.has(k) else None for k in ("prefill_a", "prefill_b")}
    decode = t.number("decode_s_per_token", 0.0, minimum=0.0) if t.has("decode_s_per_token") else None
    given = [k for k, v in (*numbers.items(), ("decode_s_per_token", decode)) if v is not None]
    if profile is None and fit_from is None and len(given) < 3:
        missing = [k for k in ("prefill_a", "prefill_b", "decode_s_per_token") if k not in given]
        raise InputError(
            f"{t.file}: {t.key(missing[0])}: missing; expected the engine's cost (s per token), "
            f'{t.key("profile")} (an emulator profile, e.g. "redbooks-g4") or {t.key("fit_from")} '
            "(a kvbench TTFT sweep's result folder)"
        )
    t.done()
    return EngineSpec(profile, numbers["prefill_a"], numbers["prefill_b"], decode, _beside(path, fit_from))


def _tiers(top: Table, path: Path) -> tuple[TierChoices, ...]:
    # without any tier every prompt is recomputed: the baseline every sizing has anyway
    raw = top.required("tiers", "one or more [[tiers]] tables")
    if not isinstance(raw, list) or not raw:
        top.fail("tiers", "expected an array of one or more tables ([[tiers]])", raw)
    out: list[TierChoices] = []
    for k, item in enumerate(raw):
        t = Table(str(path), f"tiers[{k}]", item)
        name = t.text("name", required=True, choices=TIER_NAMES)
        scope = t.text("scope", required=True, choices=SCOPES)
        if not t.has("capacity"):
            t.required("capacity", 'a size such as "80GB" or a number of bytes, or a list of them')
        capacities = _swept(t, "capacity", lambda t, k: size(t, k, 0))
        bandwidths = _swept(t, "read_bandwidth", _bandwidth)
        latency = t.number("latency_s", 0.0, minimum=0.0)
        writes = t.text("writes", "behind", choices=WRITES)
        if writes != "behind" and None in bandwidths:
            t.fail("writes", 'expected "behind" for a free tier: its writes have no read bandwidth to share', writes)
        if writes == "evicted" and not out:
            t.fail("writes", 'expected "behind" or "shared" for the first tier: no faster tier evicts into it', writes)
        t.done()
        if out and TIER_NAMES.index(name) <= TIER_NAMES.index(out[-1].name):
            t.fail("name", f"expected a tier slower than {out[-1].name} (tiers go fastest first, each once)", name)
        out.append(TierChoices(name, scope, capacities, bandwidths, latency, writes))
    return tuple(out)


def _swept(t: Table, k: str, one: Callable[[Table, str], T]) -> tuple[T, ...]:
    """A key that takes one value, or a list of them (a sweep), each read by `one` and its error
    naming its place in the list (`tiers[1].capacity[2]`)."""
    v = t.data.get(k)
    if not isinstance(v, list):
        return (one(t, k),)
    t.get(k)
    if not v or len(v) > MAX_SWEPT:
        t.fail(k, f"expected a value, or a list of 1 to {MAX_SWEPT} values (a sweep)", v)
    out = tuple(one(Table(t.file, t.path, {f"{k}[{i}]": x}), f"{k}[{i}]") for i, x in enumerate(v))
    if len(set(out)) < len(out):
        t.fail(k, "expected each value of a sweep once", v)
    return out


def _bandwidth(t: Table, k: str) -> float | None:
    v: Any = t.get(k)
    if v is None or v == "free":
        return None
    if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
        return float(v)
    from harness.core.units import parse_bandwidth

    try:
        if not isinstance(v, str):
            raise ValueError("")
        bps = parse_bandwidth(v)
    except ValueError:
        t.fail(k, 'expected a bandwidth such as "50GB/s", bytes/s, or "free"', v)
    if bps <= 0:
        t.fail(k, "expected a bandwidth > 0", v)
    return bps
