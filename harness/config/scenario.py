"""Scenario files: strict TOML into frozen dataclasses.

Unknown keys and wrong types are errors that name the file, the key path and what was expected.
Every key is documented in scenarios/README.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.config import engines as engine_config
from harness.config import kinds, reference
from harness.config import traffic as traffic_config
from harness.config.context import MAX_CONTEXT_TOKENS, Context
from harness.config.engines import EngineCfg
from harness.config.kinds import WorkloadConfig
from harness.config.tables import Collect, Table, read_toml, size
from harness.config.traffic import TrafficCfg
from harness.core.clock import MAX_TIME_SCALE
from harness.core.errors import InputError

SCHEMA_VERSION = 1
# The longest SSE line (or event) a response may send, by default: far above any chunk an engine sends.
MAX_LINE_BYTES = 4 << 20
# The embedded emulator's profiles (harness/emulator/profiles.py defines them under these names).
EMULATOR_PROFILES = ("recompute", "redbooks-g4", "tiered")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HTTP_HOOK_RE = re.compile(r"^(GET|POST|PUT|DELETE) (\S+)$")


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 10.0
    first_token_s: float = 900.0
    idle_s: float = 300.0
    total_s: float = 3600.0
    # A request that has heard nothing for liveness_s makes the client ask the server's
    # /models; no answer within liveness_probe_s, and the server is dead (0: never ask).
    liveness_s: float = 30.0
    liveness_probe_s: float = 15.0


@dataclass(frozen=True)
class EndpointCfg:
    api: Literal["chat", "completions"] = "chat"
    max_tokens: int = 16
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    url: str | None = None
    model: str | None = None
    send_cache_salt: Literal["auto", "always", "never"] = "auto"
    timeouts: Timeouts = Timeouts()
    max_line_bytes: int = MAX_LINE_BYTES  # the longest SSE line (or event) a response may send
    # token chunks one response may carry; 0: twice the request's max_tokens and 64 more
    max_response_tokens: int = 0
    # who sends the streams: kvbench's own transport, or aiohttp's client (an escape hatch)
    transport: Literal["kvbench", "aiohttp"] = "kvbench"
    # a Hugging Face tokenizer.json (or its folder): prompt lengths counted with it and the chat
    # template beside it, for servers with no /tokenize (hf_tokenizer.py)
    tokenizer: str | None = None


@dataclass(frozen=True)
class PromptsCfg:
    source: Literal["synthetic", "file"] = "synthetic"
    seed: int = 42
    path: str | None = None
    tolerance: float = 0.005


WARM_FROM = ("active", "host", "disk")  # arms: where a warm request finds its KV


@dataclass(frozen=True)
class Slo:
    """Latency targets: a request meets the SLO when it succeeded within every limit given; a
    load holds the SLO when at least `share` of its measured requests meet it."""

    ttft_s: float | None = None
    tpot_s: float | None = None  # time per output token after the first: (e2e - ttft) / (tokens - 1)
    e2e_s: float | None = None
    share: float = 0.9

    def limits(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s), ("e2e_s", self.e2e_s)) if v}


@dataclass(frozen=True)
class Hook:
    http: str | None = None  # "METHOD path-or-URL"
    command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Arm:
    name: str
    cache: Literal["reuse", "bust"] = "reuse"
    endpoint: str | None = None
    before: Hook | None = None
    description: str = ""
    traffic: bool = True  # run the scenario's [traffic] during this arm (when there is one)
    # where a warm request finds its KV (tiers.py): where the engine left it, or in a tier below
    # that kvbench puts it in first; the engine's slot files, as kvbench sees them (disk)
    warm_from: Literal["active", "host", "disk"] = "active"
    slot_dir: str | None = None
    # the engine kvbench starts, as this arm runs it (`[[arms]] engine`: [engine] with the arm's
    # own values of the keys its kind lets change between arms); None: as [engine] says
    engine: EngineCfg | None = None


@dataclass(frozen=True)
class EmulatorCfg:
    profile: str = "redbooks-g4"
    time_scale: float = 1.0
    max_time_scale: float | None = None  # above it the emulator cannot keep this test's modelled time
    capacity_blocks: dict[str, int] = field(default_factory=dict)  # tier name -> its capacity in KV blocks


@dataclass(frozen=True)
class ModelCfg:
    # default: gpt-oss-120b's, from the reference file
    kv_bytes_per_token: int = field(default_factory=reference.kv_bytes_per_token)
    # the longest prompt (with its output) any workload may ask for, when the server's is not known
    max_context_tokens: int = MAX_CONTEXT_TOKENS


@dataclass(frozen=True)
class MetricsCfg:
    """The server's Prometheus endpoint(s), scraped around every phase."""

    enabled: bool = True
    urls: tuple[str, ...] = ()  # default: the endpoint's server root + /metrics
    extra_urls: tuple[str, ...] = ()  # e.g. Dynamo KVBM's own port (6880)
    interval_s: float = 0.0  # > 0: also a time series every interval_s seconds


@dataclass(frozen=True)
class ReferenceCfg:
    """Which published test this scenario reproduces, so reports put its figures beside."""

    paper: Literal["redbooks-md260021"] = "redbooks-md260021"
    test: Literal["ttft", "concurrency", "competing_traffic"] = "ttft"


@dataclass(frozen=True)
class DistributedCfg:
    """[distributed]: send each arm from workers on many client hosts (raypool.py)."""

    engine: Literal["ray"] = "ray"
    address: str = "auto"  # a Ray cluster's address; "auto": the cluster this host belongs to
    workers: int | None = None  # worker actors, one CPU each; default: one per CPU of the cluster
    # a worker that sends neither records nor a heartbeat (one a second) this long is lost (s);
    # `--workers` processes keep this default (a [distributed] table means Ray)
    lost_after_s: float = 5.0


@dataclass(frozen=True)
class Scenario:
    schema_version: int
    name: str
    description: str
    endpoint: EndpointCfg
    prompts: PromptsCfg
    workload: WorkloadConfig  # the kind's own config (harness/workloads/<kind>.py)
    arms: tuple[Arm, ...]
    emulator: EmulatorCfg
    model: ModelCfg
    reference: ReferenceCfg | None = None
    traffic: TrafficCfg | None = None
    metrics: MetricsCfg = MetricsCfg()
    slo: Slo | None = None
    engine: EngineCfg | None = None
    distributed: DistributedCfg | None = None
    gate: dict[str, Any] | None = None  # the [gate] table, read by harness.gate.rules.parse_rules
    path: str = field(default="", compare=False)
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # the file as written

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("path")
        d.pop("raw")
        return d

    def digest(self) -> str:
        """Hash of the scenario as written: what makes two runs comparable. It covers the file's
        own keys (so a later kvbench that adds optional keys keeps old hashes), not its gate
        rules, reference, descriptions or the emulator's max_time_scale: they change no
        measurement (the time scale a run used is recorded, and compared, on its own)."""
        d = {k: v for k, v in self.raw.items() if k not in ("gate", "description", "reference")}
        if isinstance(d.get("emulator"), dict):
            d["emulator"] = {k: v for k, v in d["emulator"].items() if k != "max_time_scale"}
        if isinstance(d.get("arms"), list):
            d["arms"] = [{k: v for k, v in a.items() if k != "description"} for a in d["arms"] if isinstance(a, dict)]
        canon = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canon.encode()).hexdigest()[:16]

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise InputError(f"{self.path}: no arm named {name!r} (arms: {', '.join(a.name for a in self.arms)})")


def load(path: str | Path) -> Scenario:
    return parse(read_toml(Path(path), "scenario file"), str(path))


def parse(data: dict[str, Any], file: str) -> Scenario:
    """The scenario, or an InputError naming every section's first mistake (each section is read
    on its own, so that one bad section does not hide another's)."""
    top = Table(file, "", data)
    # every top-level key a scenario may have (read below, skipped after an error, or absent): a
    # mistyped section is then named with its likely meaning
    top.known(*SECTIONS)
    read = Collect(file)
    head = read(_head, top)
    engine = read(engine_config.parse, top.sub("engine")) if top.has("engine") else None
    endpoint = read(_endpoint, top.sub("endpoint"))
    prompts = read(_prompts, top.sub("prompts"))
    workload = read(kinds.parse, top.sub("workload"))
    # an arm's engine keys are read against the [engine]: not when that failed
    arms = read(_arms, top, file, engine) if not (top.has("engine") and engine is None) else None
    emulator = read(_emulator, top.sub("emulator"))
    model = read(_model, top.sub("model"))
    reference = read(_reference, top.sub("reference")) if top.has("reference") else None
    traffic = read(traffic_config.parse, top.sub("traffic")) if top.has("traffic") else None
    metrics = read(_metrics, top.sub("metrics"))
    slo = read(_slo, top.sub("slo")) if top.has("slo") else None
    distributed = read(_distributed, top.sub("distributed")) if top.has("distributed") else None
    gate = read(_gate, top, file)
    read(top.done)
    read.check()
    # (read.check raised for any that failed)
    assert head is not None and endpoint is not None and prompts is not None and workload is not None
    assert arms is not None and emulator is not None and model is not None and metrics is not None
    scenario = Scenario(
        schema_version=head[0],
        name=head[1],
        description=head[2],
        endpoint=endpoint,
        prompts=prompts,
        workload=workload,
        arms=arms,
        emulator=emulator,
        model=model,
        reference=reference,
        traffic=traffic,
        metrics=metrics,
        slo=slo,
        engine=engine,
        distributed=distributed,
        gate=gate,
        path=file,
        raw=data,
    )
    check_lengths(scenario, Context.of(scenario))
    scenario.workload.check(scenario)
    return scenario


SECTIONS = (
    "schema_version",
    "name",
    "description",
    "endpoint",
    "prompts",
    "workload",
    "arms",
    "emulator",
    "model",
    "reference",
    "traffic",
    "metrics",
    "slo",
    "engine",
    "distributed",
    "gate",
)


def _head(top: Table) -> tuple[int, str, str]:
    version = top.integer("schema_version", required=True, what=f"the schema version ({SCHEMA_VERSION})")
    if version != SCHEMA_VERSION:
        top.fail("schema_version", f"expected {SCHEMA_VERSION} (the only version this kvbench reads)", version)
    name = top.text("name", required=True)
    if not _NAME_RE.match(name):
        top.fail("name", "expected letters, digits, '.', '_' or '-' (it names the results folder)", name)
    return version, name, top.text("description", "")


def _endpoint(t: Table) -> EndpointCfg:
    extra = t.get("extra_body")
    if extra is not None and not isinstance(extra, dict):
        t.fail("extra_body", "expected a table (merged into every request body)", extra)
    tt = t.sub("timeouts")
    timeouts = Timeouts(
        connect_s=tt.number("connect_s", Timeouts.connect_s, positive=True),
        first_token_s=tt.number("first_token_s", Timeouts.first_token_s, positive=True),
        idle_s=tt.number("idle_s", Timeouts.idle_s, positive=True),
        total_s=tt.number("total_s", Timeouts.total_s, positive=True),
        liveness_s=tt.number("liveness_s", Timeouts.liveness_s, minimum=0.0),
        liveness_probe_s=tt.number("liveness_probe_s", Timeouts.liveness_probe_s, positive=True),
    )
    tt.done()
    cfg = EndpointCfg(
        api=t.text("api", EndpointCfg.api, ("chat", "completions")),
        max_tokens=t.integer(
            "max_tokens", EndpointCfg.max_tokens, minimum=1, what="an integer number of output tokens"
        ),
        temperature=t.number("temperature", EndpointCfg.temperature, minimum=0.0),
        extra_body=dict(extra or {}),
        url=t.text("url"),
        model=t.text("model"),
        send_cache_salt=t.text("send_cache_salt", EndpointCfg.send_cache_salt, ("auto", "always", "never")),
        max_line_bytes=size(t, "max_line_bytes", EndpointCfg.max_line_bytes),
        max_response_tokens=t.integer(
            "max_response_tokens",
            EndpointCfg.max_response_tokens,
            minimum=0,
            what="an integer number of token chunks (0: twice max_tokens and 64 more)",
        ),
        transport=t.text("transport", EndpointCfg.transport, ("kvbench", "aiohttp")),
        tokenizer=t.text("tokenizer"),
        timeouts=timeouts,
    )
    t.done()
    return cfg


def _prompts(t: Table) -> PromptsCfg:
    cfg = PromptsCfg(
        source=t.text("source", PromptsCfg.source, ("synthetic", "file")),
        seed=t.integer("seed", PromptsCfg.seed, minimum=0),
        path=t.text("path"),
        tolerance=t.number("tolerance", PromptsCfg.tolerance, minimum=0.0),
    )
    if cfg.source == "file" and not cfg.path:
        raise InputError(f'{t.file}: prompts.path: missing; expected a JSONL file (source = "file")')
    t.done()
    return cfg


def longest_prompts(sc: Scenario) -> list[tuple[str, int, str]]:
    """The longest prompt each length key of the workload can make, with its output: (key, tokens,
    how that length comes about)."""
    return sc.workload.longest_prompts(sc.endpoint.max_tokens)


def check_lengths(sc: Scenario, context: Context) -> None:
    """Refuse a workload whose prompts could be longer than the model's context: a server refuses
    them anyway, and kvbench would build them first. Traces are checked line by line as they are
    read (traces.read)."""
    for key, n, how in longest_prompts(sc):
        if n > context.tokens:
            raise InputError(
                f"{sc.path}: {key}: prompts up to {n:,} tokens with their output{how}, beyond the model's "
                f"context of {context.tokens:,} tokens ({context.source})"
            )


def _arms(top: Table, file: str, engine: EngineCfg | None) -> tuple[Arm, ...]:
    raw = top.get("arms")
    if raw is None:
        return (Arm("default"),)
    if not isinstance(raw, list) or not raw:
        top.fail("arms", "expected one or more [[arms]] tables", raw)
    arms: list[Arm] = []
    for i, item in enumerate(raw):
        t = Table(file, f"arms[{i}]", item)
        name = t.text("name", required=True)
        if not _NAME_RE.match(name):
            t.fail("name", "expected letters, digits, '.', '_' or '-' (it names the results folder)", name)
        if any(a.name == name for a in arms):
            t.fail("name", "expected a name not used by another arm", name)
        arms.append(
            Arm(
                name=name,
                cache=t.text("cache", Arm.cache, ("reuse", "bust")),
                endpoint=t.text("endpoint"),
                before=_hook(t.sub("before")) if t.has("before") else None,
                description=t.text("description", ""),
                traffic=t.flag("traffic", Arm.traffic),
                warm_from=t.text("warm_from", Arm.warm_from, WARM_FROM),
                slot_dir=t.text("slot_dir"),
                engine=engine_config.for_arm(t, top, engine) if t.has("engine") else None,
            )
        )
        if arms[-1].warm_from != "active" and arms[-1].cache == "bust":
            t.fail("warm_from", 'applies to cache = "reuse" arms (a bust arm has no warm request)', arms[-1].warm_from)
        if arms[-1].slot_dir is not None and arms[-1].warm_from != "disk":
            t.fail("slot_dir", 'applies to warm_from = "disk" only', arms[-1].slot_dir)
        t.done()
    return tuple(arms)


def _hook(t: Table) -> Hook:
    http, command = t.get("http"), t.get("command")
    if (http is None) == (command is None):
        t.fail("", 'expected exactly one of http = "POST /path" or command = ["argv", ...]', t.data)
    t.done()
    if http is not None:
        if not isinstance(http, str) or not _HTTP_HOOK_RE.match(http):
            t.fail("http", 'expected "METHOD /path" or "METHOD http://host/path" (GET, POST, PUT, DELETE)', http)
        return Hook(http=http)
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        t.fail("command", "expected a non-empty list of strings (argv; no shell)", command)
    return Hook(command=tuple(command))


def _emulator(t: Table) -> EmulatorCfg:
    cfg = EmulatorCfg(
        profile=t.text("profile", EmulatorCfg.profile, EMULATOR_PROFILES),
        time_scale=t.number("time_scale", EmulatorCfg.time_scale, positive=True, maximum=MAX_TIME_SCALE),
        max_time_scale=t.number("max_time_scale", 0.0, positive=True, maximum=MAX_TIME_SCALE) or None,
        capacity_blocks=_capacities(t.sub("capacity_blocks")),
    )
    t.done()
    if cfg.max_time_scale is not None and cfg.time_scale > cfg.max_time_scale:
        t.fail("time_scale", f"expected at most max_time_scale ({cfg.max_time_scale:g})", cfg.time_scale)
    return cfg


TIER_NAMES = ("G1", "G2", "G3", "G4")  # the KV tiers by the field's names, fastest first


def _capacities(t: Table) -> dict[str, int]:
    """`capacity_blocks = { G1 = 1000, ... }`: tiers of the emulator's profile, in KV blocks."""
    out = {k: t.integer(k, minimum=1, what="an integer number of KV blocks") for k in TIER_NAMES if t.has(k)}
    t.done()
    return out


def _distributed(t: Table) -> DistributedCfg:
    cfg = DistributedCfg(
        engine=t.text("engine", required=True, choices=("ray",)),
        address=t.text("address", DistributedCfg.address),
        workers=t.integer("workers", None, minimum=1, what="an integer number of workers"),
        lost_after_s=t.number("lost_after_s", DistributedCfg.lost_after_s, minimum=2.0),  # two heartbeats
    )
    if not cfg.address.strip():
        t.fail("address", 'expected a Ray cluster address, or "auto"', cfg.address)
    t.done()
    return cfg


def _url_list(t: Table, k: str) -> tuple[str, ...]:
    v = t.get(k)
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in v):
        t.fail(k, "expected a list of http(s) URLs", v)
    return tuple(v)


def _metrics(t: Table) -> MetricsCfg:
    cfg = MetricsCfg(
        enabled=t.flag("enabled", MetricsCfg.enabled),
        urls=_url_list(t, "urls"),
        extra_urls=_url_list(t, "extra_urls"),
        interval_s=t.number("interval_s", MetricsCfg.interval_s, minimum=0.0),
    )
    t.done()
    return cfg


def _slo(t: Table) -> Slo:
    limits = {k: t.number(k, 0.0, positive=True) or None for k in ("ttft_s", "tpot_s", "e2e_s")}
    share = t.get("share")
    if share is not None and (
        not isinstance(share, int | float) or isinstance(share, bool) or not math.isfinite(share) or not 0 < share <= 1
    ):
        t.fail("share", "expected the share of requests that must meet the SLO, in (0, 1]", share)
    t.done()
    if not any(limits.values()):
        t.fail("", "expected at least one of ttft_s, tpot_s, e2e_s (seconds)", t.data)
    return Slo(**limits, share=float(share) if share is not None else Slo.share)


def _gate(top: Table, file: str) -> dict[str, Any] | None:
    raw = top.get("gate")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        top.fail("gate", "expected a table with thresholds and/or regression", raw)
    return raw  # its rules are read by the gate (gate/rules.py), which `validate` and `run` ask first


def _reference(t: Table) -> ReferenceCfg:
    cfg = ReferenceCfg(
        paper=t.text("paper", ReferenceCfg.paper, ("redbooks-md260021",)),
        test=t.text("test", None, ("ttft", "concurrency", "competing_traffic"), required=True),
    )
    t.done()
    return cfg


def _model(t: Table) -> ModelCfg:
    cfg = ModelCfg(
        kv_bytes_per_token=t.integer(
            "kv_bytes_per_token", reference.kv_bytes_per_token(), minimum=1, what="an integer"
        ),
        max_context_tokens=t.integer(
            "max_context_tokens", MAX_CONTEXT_TOKENS, minimum=1, what="an integer number of tokens"
        ),
    )
    t.done()
    return cfg
