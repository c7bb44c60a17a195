"""The distribution layer's one vocabulary: every message between a worker, its launcher, the
coordinator and the arm's Dispatch (which lives in the coordinator), as a frozen dataclass. Both
carriers move them as they are (multiprocessing's pipe for `--workers`, Ray's calls for `--ray`:
each pickles what it carries), so there is no encoding of kvbench's own beyond a record's tagged
line (dispatch.tagged); each side has one handler that matches on these types.

Which way each goes:
- launcher -> worker process, first: its `Share` of the arm.
- worker -> coordinator (its launcher carries them): `Up`, `Records`, then `Ended` or `Failed`;
  a launcher adds `Lost` for a worker it saw die. Its asks of the Dispatch travel the same way:
  `Want` (answered `Items`), `ReadyAt` (answered `StartAt`).
- coordinator -> worker: the answers, `Go`, `Stop`, and `Alive` at least once a heartbeat
  (carried by its launcher: over the pipe, or relayed by a Ray worker's actor at each fetch).
- a Ray worker's actor -> coordinator: `Shipment`, the worker's events and asks fetched by a call
  that acknowledges the last one (raypool.py: what is not acknowledged is sent again).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.workloads.base import ArmSpec, Plan

Item = tuple[int, int]  # (schedule index, prompt index)


@dataclass(frozen=True)
class Share:
    """What one worker sends of an arm: the first message its process gets (over its pipe)."""

    index: int
    spec: ArmSpec
    kind: str
    headers: dict[str, str]  # may hold the API key: travels through a pipe or Ray's RPC, never argv or disk
    plan: Plan
    connections: int
    first_connection: int
    send_clock: bool  # tell the embedded emulator when requests left: only on the emulator's own host
    flush_s: float  # how often it ships its finished records (its launcher's Pool.flush_s)
    batch_s: float  # a closed loop's batch of the schedule: what it sends in this long (its launcher's Pool.batch_s)
    lost_after_s: float  # the liveness bound: how long a call may keep failing transiently before its peer is gone
    offset_ns: int = 0  # how far the worker's monotonic clock is ahead of the coordinator's


# -- worker -> coordinator ---------------------------------------------------------------------


@dataclass(frozen=True)
class Up:
    """The worker's client is ready: it can send once told `Go`."""


@dataclass(frozen=True)
class Records:
    """Finished records as tagged lines (dispatch.tagged); empty: a heartbeat."""

    lines: bytes = b""


@dataclass(frozen=True)
class Ended:
    """The worker's last word: what its client saw. `interrupted`: it stopped before its share of
    the schedule ran out (told to, or its pipe to its launcher closed)."""

    client_health: dict[str, Any]
    warnings: list[str]
    aborted: str | None
    interrupted: bool


@dataclass(frozen=True)
class Failed:
    """The worker's last word when its arm raised."""

    why: str


@dataclass(frozen=True)
class Lost:
    """Said of a worker by its launcher or the coordinator's silence rule: it is gone."""

    why: str


Event = Up | Records | Ended | Failed | Lost
LAST_WORDS = (Ended, Failed)

# -- asks of the Dispatch ------------------------------------------------------------------------


@dataclass(frozen=True)
class Want:
    """Worker `worker` asks for up to `n` of its next requests. `seq` numbers its asks: the same
    ask sent again (a transient error on the way) gets the same items, not new ones."""

    worker: int
    n: int
    seq: int


@dataclass(frozen=True)
class ReadyAt:
    """Worker `worker` has its open loop's warm-up answered (coordinator ns)."""

    worker: int
    ns: int


Ask = Want | ReadyAt

# -- to a worker ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Items:
    """The Dispatch's answer to the `Want` numbered `seq`: none means the schedule has no more
    for this worker. The same answer told twice (a call made again after its reply was lost) is
    taken once."""

    items: list[Item]
    seq: int


@dataclass(frozen=True)
class StartAt:
    """An open loop's measured part starts at `ns` (coordinator ns)."""

    ns: int


@dataclass(frozen=True)
class Go:
    """The arm's clock started at `t0_ns` (coordinator ns)."""

    t0_ns: int


@dataclass(frozen=True)
class Stop:
    """Send nothing new and finish what is in flight; `now` (Ctrl-C pressed again): cut what is
    in flight short at once, each request recorded so, and ship the records."""

    now: bool = False


@dataclass(frozen=True)
class Alive:
    """The coordinator is there. A worker that hears nothing from it (this, or any other word)
    for its liveness bound sends nothing new until it does: a dead, unreachable or paused
    coordinator leaves no load running, and a worker declared lost (never told again) never
    sends again."""


Told = Items | StartAt | Go | Stop | Alive

# -- a Ray worker's actor and the coordinator ------------------------------------------------------


@dataclass(frozen=True)
class Shipment:
    """A Ray worker actor's answer to the coordinator's fetch: `events` numbered `seq`. The next
    fetch acknowledges it by that number; until then the actor sends it again, so that a reply
    lost on the way loses nothing. An empty shipment keeps the last number."""

    seq: int
    events: list[Event | Want | ReadyAt]
