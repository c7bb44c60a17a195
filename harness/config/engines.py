"""Engines kvbench starts for a run (`[engine]`), each kind with its config and parser, found by
its `kind` as workload kinds are (`KINDS`): llama.cpp's llama-server and NVIDIA Dynamo's frontend
and mocker workers (harness/engines/ starts them). An arm may set the keys its engine's kind lets
change between arms (`per_arm`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar, Literal

from harness.config import reference
from harness.config.context import Context
from harness.config.tables import Table, bandwidth


@dataclass(frozen=True)
class LlamaEngineCfg:
    """llama.cpp's llama-server, started by kvbench for the run (harness/engines/llamacpp.py)."""

    label: ClassVar[str] = "llama.cpp's llama-server"
    per_arm: ClassVar[tuple[str, ...]] = ()  # keys an arm may set for itself (none: one server per run)
    kind: Literal["llamacpp"] = "llamacpp"
    model: str = "tiny"  # a model kvbench makes (harness/engines/models.py SIZES) or a GGUF file
    slots: int = 1  # llama-server -np
    ctx_per_slot: int = 20480
    cache_ram_mib: int | None = None  # --cache-ram (None: llama.cpp's default; 0: no host-memory cache)
    slot_dir: str | None = None  # --slot-save-path (None: a folder kvbench makes and removes)
    threads: int | None = None  # -t (None: every core)

    @property
    def context(self) -> Context:
        return Context(self.ctx_per_slot, "engine.ctx_per_slot")


@dataclass(frozen=True)
class MockerTiming:
    """The mocker's times as kvbench's cost model (`[engine] timing`): a prefill of n prompt tokens
    computed (those it found cached not counted) takes a*n + b*n^2 seconds, each output token
    after the first d seconds, whatever else runs. Without it the mocker times requests by its own
    built-in polynomials, which match no engine measured here. The names are `kvbench size`'s
    `[engine]` keys, so that a run and its sizing can be given the same times."""

    prefill_a: float  # s per token
    prefill_b: float  # s per token^2
    decode_s_per_token: float

    keys: ClassVar[tuple[str, ...]] = ("prefill_a", "prefill_b", "decode_s_per_token")


@dataclass(frozen=True)
class FittedTiming:
    """`[engine] timing = { fit_from = "results/..." }`: the mocker's times fitted, when the run
    starts, to a TTFT sweep kvbench ran on a real engine, as `kvbench size`'s `[engine] fit_from`
    fits them (its cold TTFTs' a*n + b*n^2, its median TPOT): a mocker calibrated to something
    measured. The path is relative to the current directory, as a scenario's paths are."""

    fit_from: str


DYNAMO_CONTEXT = 16384  # the context of the model kvbench makes for Dynamo (engines/vllm/make_model.py CTX)


@dataclass(frozen=True)
class DynamoEngineCfg:
    """NVIDIA Dynamo's frontend and KV router over its GPU-free mocker workers, started by kvbench
    for the run (harness/engines/dynamo.py)."""

    label: ClassVar[str] = "NVIDIA Dynamo's frontend and mocker workers"
    # the workers' own flags, and the frontend's router: kvbench restarts them before each arm
    # (harness/engines/dynamo.py)
    per_arm: ClassVar[tuple[str, ...]] = ("g1_blocks", "g2_blocks", "g2_bandwidth", "router_mode")
    kind: Literal["dynamo"] = "dynamo"
    workers: int = 1  # mocker workers, one process each
    router_mode: Literal["kv", "round-robin"] = "kv"  # the frontend's choice of worker
    block_size: int = 16  # tokens per KV block
    g1_blocks: int = 2048  # the device's KV blocks per worker
    g2_blocks: int = 0  # the host tier's KV blocks per worker (0: no G2)
    g2_bandwidth: str = "32GB/s"  # G1 <-> G2, each way, as written
    g2_bytes_per_s: float = 32e9
    kv_bytes_per_token: int = 0  # what the mocker moves between tiers (read: the paper's model's)
    timing: MockerTiming | FittedTiming | None = None  # None: the mocker's built-in polynomials

    @property
    def context(self) -> Context:
        return Context(DYNAMO_CONTEXT, "the model kvbench makes for Dynamo")


EngineCfg = LlamaEngineCfg | DynamoEngineCfg


def parse(t: Table) -> EngineCfg:
    """`[engine]` (or an arm's merged over it): its kind's config, every key checked."""
    kind = t.text("kind", LlamaEngineCfg.kind, tuple(KINDS))
    cfg = KINDS[kind](t)
    t.done()
    return cfg


def _llamacpp(t: Table) -> LlamaEngineCfg:
    return LlamaEngineCfg(
        model=t.text("model", LlamaEngineCfg.model),
        slots=t.integer("slots", LlamaEngineCfg.slots, minimum=1, what="an integer number of slots"),
        ctx_per_slot=t.integer(
            "ctx_per_slot", LlamaEngineCfg.ctx_per_slot, minimum=256, what="an integer number of tokens"
        ),
        cache_ram_mib=t.integer("cache_ram_mib", None, minimum=-1, what="MiB (0: none, -1: no limit)"),
        slot_dir=t.text("slot_dir"),
        threads=t.integer("threads", None, minimum=1, what="an integer number of threads"),
    )


def _dynamo(t: Table) -> DynamoEngineCfg:
    d = DynamoEngineCfg
    blocks = "an integer number of KV blocks"
    g2 = t.text("g2_bandwidth", d.g2_bandwidth)
    bps = bandwidth(t, "g2_bandwidth", g2)
    cfg = DynamoEngineCfg(
        workers=t.integer("workers", d.workers, minimum=1, what="an integer number of mocker workers"),
        router_mode=t.text("router_mode", d.router_mode, ("kv", "round-robin")),
        block_size=t.integer("block_size", d.block_size, minimum=1, what="an integer number of tokens"),
        g1_blocks=t.integer("g1_blocks", d.g1_blocks, minimum=1, what=blocks),
        g2_blocks=t.integer("g2_blocks", d.g2_blocks, minimum=0, what=blocks + " (0: no G2)"),
        g2_bandwidth=g2,
        g2_bytes_per_s=bps,
        kv_bytes_per_token=t.integer("kv_bytes_per_token", None, minimum=1, what="bytes")
        or reference.kv_bytes_per_token(),  # gpt-oss-120b's
        timing=_timing(t.sub("timing")) if t.has("timing") else None,
    )
    if t.has("g2_bandwidth") and not cfg.g2_blocks:
        t.fail("g2_bandwidth", "applies with g2_blocks > 0 (a host tier)", g2)
    return cfg


def _timing(t: Table) -> MockerTiming | FittedTiming:
    """`[engine] timing`: `fit_from` alone, or each of MockerTiming's keys, seconds (or per
    token) >= 0."""
    fit_from = t.text("fit_from")
    if fit_from is not None:
        for k in MockerTiming.keys:
            if t.has(k):
                t.fail(k, "applies without fit_from (the fit gives it)", t.get(k))
        t.done()
        return FittedTiming(fit_from)
    what = "a number of seconds >= 0, or fit_from alone"
    for k in MockerTiming.keys:
        t.required(k, what)
    cfg = MockerTiming(*(t.number(k, 0.0, minimum=0.0) for k in MockerTiming.keys))
    t.done()
    return cfg


# Each kind of engine's parser, by its `kind`
KINDS: Mapping[str, Callable[[Table], EngineCfg]] = MappingProxyType({"llamacpp": _llamacpp, "dynamo": _dynamo})


def for_arm(arm: Table, top: Table, engine: EngineCfg | None) -> EngineCfg:
    """An arm's `engine`: [engine] with the arm's own values of the keys its kind lets an arm set
    (`per_arm`), checked as [engine] is."""
    own = arm.sub("engine")
    if engine is None:
        own.fail("", "applies with an [engine] table (an engine kvbench starts for the run)", own.data)
    if arm.has("before"):
        own.fail("", "applies to an arm without a `before` of its own (kvbench restarts the engine with it)", own.data)
    for k in own.data:
        if k not in engine.per_arm:
            can = ", ".join(engine.per_arm) or "none"
            own.fail(k, f"expected a key {engine.label} can change between arms ({can})", own.data[k])
    return parse(Table(own.file, own.path, {**top.get("engine"), **own.data}))
