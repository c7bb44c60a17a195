"""Where an arm's workers run, asked one way by the runner (`launcher_for`): a `Launcher` places
and starts workers, and makes each arm's coordinator (`Pool`) over them. Two launchers: processes
of this host (`--workers N`) and the workers of a Ray cluster (`--ray`), joined and started once
for every arm. The runner imports neither Ray's launcher nor a pool; Ray itself is imported only
by raypool, once `--ray` is given."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from harness.config.scenario import DistributedCfg
from harness.distributed import raypool
from harness.distributed.coordinator import Pool
from harness.distributed.local import LocalPool
from harness.results import RunWriter
from harness.workloads.base import Plan, Sender


class Launcher(Protocol):
    """Workers placed and started for a run; each arm's `Pool` (coordinator.py) over them, built
    the same way whichever the launcher."""

    def pool(self, sender: Sender, kind: str, plan: Plan, sink: RunWriter, emulated: bool) -> Pool: ...


@dataclass(frozen=True)
class Processes:
    """`--workers N`: N spawned processes of this host, started anew for each arm."""

    n: int
    lost_after_s: float = DistributedCfg.lost_after_s

    def pool(self, sender: Sender, kind: str, plan: Plan, sink: RunWriter, emulated: bool) -> Pool:
        return LocalPool(sender, kind, plan, self.n, sink, emulated, self.lost_after_s)


@dataclass(frozen=True)
class RayWorkers:
    """`--ray`: a worker actor per CPU (or as many as asked) on the cluster's nodes, started once."""

    cluster: raypool.Cluster

    def pool(self, sender: Sender, kind: str, plan: Plan, sink: RunWriter, emulated: bool) -> Pool:
        return raypool.RayPool(self.cluster, sender, kind, plan, sink, emulated)


class Interrupted(Exception):
    """A stop came while a launcher joined a cluster or started its workers: nothing was sent."""


async def launcher_for(
    stack: contextlib.AsyncExitStack[bool | None],
    distributed: DistributedCfg | None,
    workers: int,
    base_url: str,
    stop: asyncio.Event,
    say: Callable[[str], None],
) -> Launcher | None:
    """The run's launcher: Ray's (joined, its workers started and said, left when `stack` closes)
    with `distributed`, processes with `workers` over 1, else None (this process sends)."""
    if distributed is None:
        return Processes(workers) if workers > 1 else None
    say(f"Joining the Ray cluster at {distributed.address} ...")
    if not await stack.enter_async_context(raypool.joined(distributed.address, stop)):
        raise Interrupted("Interrupted while joining the Ray cluster: nothing was sent.")
    d = distributed
    cluster = await raypool.start(d.address, d.workers, base_url, d.lost_after_s, stop, say)
    if cluster is None:
        raise Interrupted("Interrupted while Ray started the workers: nothing was sent.")
    hosts = {m.info["hostname"] for m in cluster.members}
    say(f"{len(cluster.members)} Ray workers on {len(hosts)} host(s)")
    return RayWorkers(cluster)
