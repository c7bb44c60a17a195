"""The registry of workload kinds, and the base of every kind's `[workload]` config.

A kind has three parts, one per layer, so that reading a scenario, a report or a gate never
imports what sends requests (k6 keeps an executor's config apart from the executor):
- its **spec** (`KindSpec`, here in the config layer): the `[workload]` config dataclass with its
  parse and checks, the sharing policy, and what it declares of its figures and report sections;
- its **figures** (analysis/kinds/): run.json's summary, the terminal lines, the gate's figures;
- its **driver** (workloads/): plan, drive and the run of an arm at its loads.
The spec names the other two as `module:attribute`, imported only by the layer that needs them
(analysis/kinds `figures`, workloads/kind `driver`).

The built-in kinds' specs (harness/config/kinds/) are imported on first use by module name, as
pytest loads its built-in plugins. Another package adds a kind through the entry point group
`kvbench.workloads` (name: the kind's name; value: `module:SPEC`, a `KindSpec`), found the same
way; a process can also `register` one itself.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Self

from harness.config.tables import Table
from harness.core.errors import InputError
from harness.results import KindRecord

if TYPE_CHECKING:
    from harness.config.context import Context
    from harness.config.scenario import Scenario

BUILTIN = {name: f"harness.config.kinds.{name}" for name in ("sweep", "closed_loop", "open_loop", "trace", "sessions")}
PLUGIN_GROUP = "kvbench.workloads"
# Connections of an open loop without max_concurrency: beyond as many in flight, a request waits
# for a connection, and the wait shows as schedule lag.
OPEN_LOOP_CONNECTIONS = 1024
# The kinds registered or found so far in this process (a plugin registry, as pytest's is).
_known: dict[str, KindSpec] = {}


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    """A kind's `[workload]` table as read: its own frozen dataclass, tagged by `kind`. What the
    run needs to know of any workload without knowing its kind is asked of it here."""

    kind: str

    @classmethod
    def parse(cls, t: Table) -> Self:
        """The kind's keys of `t` (`kind` is read already); `t.done()` follows."""
        raise NotImplementedError

    def check(self, sc: Scenario) -> None:
        """Refuse what this kind cannot do with the rest of the scenario (the arms, the prompts):
        by default a warm request found in a lower tier (`warm_from`) is a sweep's alone."""
        for i, a in enumerate(sc.arms):
            if a.warm_from != "active":
                raise InputError(f'{sc.path}: arms[{i}].warm_from: "{a.warm_from}" applies to kind = "sweep" workloads')

    def check_files(self, scenario_path: str) -> None:
        """Files the workload reads, checked before `kvbench run` starts anything."""

    def check_inputs(self, context: Context) -> tuple[str, list[str]]:
        """The workload's input files read in full (`kvbench validate`): what they hold, in a
        few words ("" if it has none), and what to warn of."""
        return "", []

    def connections(self) -> int:
        """Connections an arm sends on at its own load, over all processes."""
        return 1

    def most_connections(self) -> int:
        """The run's connection pool: the most any load of an arm sends on at once."""
        return self.connections()

    def concurrency_cap(self) -> int | None:
        """Requests in flight at most, over all processes, where the workload caps them."""
        return None

    def shared_prefix(self) -> int:
        """Tokens every prompt shares at its head (a cold request may find them cached)."""
        return 0

    def output_lengths(self, out: int, context: Context) -> frozenset[int]:
        """Every max_tokens its requests ask for (`out`: the endpoint's), known before the run:
        for an engine that must be told them beforehand (Dynamo's mocker, engines/dynamo.py). A
        kind whose prompts set their own `Prompt.max_tokens` returns those too."""
        return frozenset({out})

    def longest_prompts(self, out: int) -> list[tuple[str, int, str]]:
        """The longest prompt each length key can make, with `out` output tokens: (key, tokens,
        how that length comes about), for the model's context bound."""
        return []


@dataclass(frozen=True, kw_only=True)
class KindSpec:
    """A workload kind as the layers below the runtime know it: its config, how its schedule may be
    shared, what it declares of its figures, and where its figures and driver are."""

    name: str
    config: type[WorkloadConfig]
    figures: str  # "module:attribute" of its `analysis.kinds.Figures`
    driver: str  # "module:attribute" of its `workloads.kind.Driver`
    # may several client processes or hosts share its schedule (--workers, --ray)
    shares_schedule: bool = True
    # schedule items one worker takes at most at a time (None: as many as its pace asks for)
    batch_limit: int | None = None
    # figures per prompt length (cold against warm) rather than a throughput
    per_length: bool = False
    # the report's own sections its runs go into (report/sections.py SECTIONS)
    report_sections: tuple[str, ...] = ()
    # per-run figures its figures' `gate_figures` adds to the gate's own (gate/rules.py PER_RUN)
    gate_metrics: tuple[str, ...] = ()
    # its own per-request fields (results.KindRecord), kept in each record's `kind_fields`: exports
    # give them as columns `<kind>.<field>`
    record: type[KindRecord] | None = None


def register(spec: KindSpec) -> None:
    """Adds a kind (or replaces one of the same name) for this process."""
    _known[spec.name] = spec


@functools.cache
def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def names() -> tuple[str, ...]:
    return tuple(dict.fromkeys([*BUILTIN, *_plugins(), *_known]))


def get(name: str) -> KindSpec:
    if name in _known:
        return _known[name]
    if name in BUILTIN:
        spec = importlib.import_module(BUILTIN[name]).SPEC
    elif name in _plugins():
        spec = _load(_plugins()[name])
    else:
        raise InputError(f"unknown workload kind {name!r} (known: {', '.join(names())})")
    _known[name] = spec
    return spec


def _load(ep: EntryPoint) -> KindSpec:
    where = f"entry point {ep.value!r} ({PLUGIN_GROUP}: {ep.name})"
    try:
        spec = ep.load()
    except (ImportError, AttributeError) as e:
        raise InputError(f"workload kind {ep.name!r}: {where} cannot be loaded: {e}") from None
    if not isinstance(spec, KindSpec) or spec.name != ep.name:
        raise InputError(f"workload kind {ep.name!r}: {where} is not the KindSpec of a kind named {ep.name!r}")
    return spec


def part(spec: KindSpec, which: str) -> Any:
    """The object a spec names as `module:attribute` for `which` ("figures" or "driver"),
    imported by the layer that asks."""
    ref = getattr(spec, which)
    module, _, attr = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise InputError(f"workload kind {spec.name!r}: its {which} {ref!r} cannot be loaded: {e}") from None


def gate_metrics() -> tuple[str, ...]:
    """The per-run figures workload kinds add to the gate's (each kind's `gate_metrics`)."""
    return tuple(dict.fromkeys(m for name in names() for m in get(name).gate_metrics))


def parse(t: Table) -> WorkloadConfig:
    """A scenario's `[workload]` table, read by its kind's config."""
    name = t.text("kind", None, names(), required=True)
    cfg = get(name).config.parse(t)
    t.done()
    return cfg
