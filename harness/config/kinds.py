"""The registry of workload kinds, and the base of every kind's `[workload]` config.

A kind is one module whose `KIND` implements `WorkloadKind` (workloads/kind.py) and whose config
is a `WorkloadConfig`. The built-in kinds (harness/workloads/) are imported on first use by module
name, as pytest loads its built-in plugins: the scenario reader, which sits below the workloads,
finds them without importing them. Another package adds a kind through the entry point group
`kvbench.workloads` (name: the kind's name; value: `module:KIND`), found the same way; a
process can also `register` one itself.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any, Self

from harness.config.tables import Table
from harness.core.errors import InputError

if TYPE_CHECKING:
    from harness.config.scenario import Context, Scenario
    from harness.workloads.kind import WorkloadKind

BUILTIN = {name: f"harness.workloads.{name}" for name in ("sweep", "closed_loop", "open_loop", "trace", "sessions")}
PLUGIN_GROUP = "kvbench.workloads"
_added: dict[str, WorkloadKind[Any]] = {}


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


def register(kind: WorkloadKind[Any]) -> None:
    """Adds a kind (or replaces one of the same name) for this process."""
    _added[kind.name] = kind


@functools.cache
def _plugins() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def names() -> tuple[str, ...]:
    return tuple(dict.fromkeys([*BUILTIN, *_plugins(), *_added]))


def get(name: str) -> WorkloadKind[Any]:
    if name in _added:
        return _added[name]
    if name in BUILTIN:
        kind = importlib.import_module(BUILTIN[name]).KIND
    elif name in _plugins():
        kind = _load(_plugins()[name])
    else:
        raise InputError(f"unknown workload kind {name!r} (known: {', '.join(names())})")
    _added[name] = kind
    return kind


def _load(ep: EntryPoint) -> WorkloadKind[Any]:
    where = f"entry point {ep.value!r} ({PLUGIN_GROUP}: {ep.name})"
    try:
        kind = ep.load()
    except (ImportError, AttributeError) as e:
        raise InputError(f"workload kind {ep.name!r}: {where} cannot be loaded: {e}") from None
    if getattr(kind, "name", None) != ep.name or not hasattr(kind, "config"):
        raise InputError(f"workload kind {ep.name!r}: {where} is not a workload kind named {ep.name!r}")
    return kind


def gate_metrics() -> tuple[str, ...]:
    """The per-run figures workload kinds add to the gate's (each kind's `gate_metrics`)."""
    return tuple(dict.fromkeys(m for name in names() for m in get(name).gate_metrics))


def parse(t: Table) -> WorkloadConfig:
    """A scenario's `[workload]` table, read by its kind's config."""
    name = t.text("kind", None, names(), required=True)
    cfg = get(name).config.parse(t)
    t.done()
    return cfg
