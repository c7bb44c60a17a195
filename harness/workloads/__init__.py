"""Workload kinds: one module each, behind one small interface.

A kind module defines
- `NAME`: the scenario's `[workload] kind`;
- `SHARES_SCHEDULE`: whether several client processes can share its schedule (`--workers`);
- `async plan(sender, prior=None) -> Plan`: prompts and schedule, settled before the arm's clock
  starts (`prior`: a plan of the same arm at another load, whose prompts it may reuse);
- `async drive(sender, plan, take=None, connections=None, first=0)`: send the requests through
  `sender.send`, which records each one and announces it to the writer, progress and checks.

A new kind is a new module here, registered in KINDS, plus its `[workload]` section in
scenario.py and scenarios/README.md. The runner, writer, report and gate need no change.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from harness.workloads import closed_loop, open_loop, sessions, sweep, trace
from harness.workloads.base import Plan, Sender


@dataclass(frozen=True)
class Kind:
    name: str
    shares_schedule: bool
    plan: Callable[[Sender, Plan | None], Awaitable[Plan]]
    drive: Callable[..., Coroutine[Any, Any, None]]


def _kind(module: Any) -> Kind:
    return Kind(module.NAME, module.SHARES_SCHEDULE, module.plan, module.drive)


KINDS: dict[str, Kind] = {k.name: k for k in map(_kind, (sweep, closed_loop, open_loop, trace, sessions))}


def get(name: str) -> Kind:
    return KINDS[name]
