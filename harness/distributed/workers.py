"""`kvbench run --workers N`: an arm sent by N processes, one event loop each, so that the
client can use more than one core. The connections are split as evenly as they go; whichever
connection of any process is free takes the next request of the schedule (one shared counter),
so a process on a busier core takes fewer and none idles at the end; an open loop's processes
take its next request in turn and send it at its time. All processes start together, once each
is ready, on one clock whose start the parent sets then. Each streams its requests to its own part file in the run
folder (requests.part-K.jsonl), and the parent merges them into requests.jsonl when all are done
(or stopped), in start order. All processes share the monotonic clock, so times line up.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.config import kinds
from harness.core import aio
from harness.core.clock import ModelClock
from harness.inputs.prompts import PromptBuilder
from harness.monitor.progress import RunProgress
from harness.monitor.selfcheck import LoopMonitor
from harness.results import RequestRecord, RunWriter, read_requests
from harness.wire.client import KEPT_ALIVE, ONE_PER_REQUEST, client_for
from harness.workloads.base import ArmSpec, Plan, Schedule, Sender

# The ids a worker process gives its requests start at index x ID_STRIDE, unique until merged.
ID_STRIDE = 10**9


@dataclass(frozen=True)
class Share:
    """What one client process (or Ray worker) sends of an arm."""

    index: int
    spec: ArmSpec
    kind: str
    headers: dict[str, str]  # may hold the API key: travels through a pipe or Ray's RPC, never argv or disk
    plan: Plan
    connections: int
    first_connection: int
    send_clock: bool  # tell the embedded emulator when requests left: only on the emulator's own host


@dataclass(frozen=True)
class Job(Share):
    folder: Path

    @property
    def part(self) -> Path:
        return self.folder / f"requests.part-{self.index}.jsonl"


class SharedOrder(Schedule):
    """The schedule, taken one request at a time by every connection of every process; an open
    loop's measured part starts once every process has its warm-up answered (the latest of them)."""

    def __init__(self, order: list[tuple[int, int]], sync: Sync, index: int) -> None:
        super().__init__(())
        self.items, self.sync, self.index = order, sync, index

    async def __anext__(self) -> tuple[int, int]:
        taken = self.sync.taken
        with taken.get_lock():
            k = taken.value
            if k >= len(self.items):
                raise StopAsyncIteration
            taken.value = k + 1
        return self.items[k]

    async def measured_start(self, ready_ns: int) -> int:
        line, arrived = self.sync.start_ns, self.sync.arrived
        with line.get_lock():
            line.value = max(line.value, ready_ns)
            arrived[self.index] = 1
        # the parent marks a process that ended without arriving, so nobody waits for it
        while not all(arrived[:]):
            await asyncio.sleep(0.001)
        return int(line.value)


@dataclass(frozen=True)
class Sync:
    """What the processes share: the schedule's counter, and the start line."""

    taken: Any  # Value("q")
    ready: Any  # Semaphore: released by each process once it can send
    go: Any  # Event: set by the parent when all are ready
    t0_ns: Any  # Value("q"): the arm clock's start, set just before `go`
    start_ns: Any  # Value("q"): an open loop's measured start, the latest any process proposed
    arrived: Any  # Array("b", n): which processes are past their warm-up (or gone)


class _PartWriter:
    def __init__(self, path: Path, process: int) -> None:
        self.f = path.open("ab")
        self.process = process

    def add(self, record: RequestRecord) -> None:
        self.f.write(replace(record, process=self.process).to_json() + b"\n")
        self.f.flush()


def _main(job: Job, sync: Sync) -> None:
    aio.run(_run(job, sync))


async def _run(job: Job, sync: Sync) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def go() -> int:
        sync.ready.release()
        while not sync.go.wait(0.05) and not stop.is_set():
            await asyncio.sleep(0)  # Ctrl-C before the start: the signal handler must run
        return int(sync.t0_ns.value)

    writer = _PartWriter(job.part, job.index)
    end = await send_share(job, SharedOrder(list(job.plan.schedule), sync, job.index), stop, [writer.add], go)
    (job.folder / f"requests.part-{job.index}.json").write_text(json.dumps(end))


async def send_share(
    job: Share,
    take: Schedule,
    stop: asyncio.Event,
    subscribers: list[Callable[[RequestRecord], None]],
    go: Callable[[], Awaitable[int]],
) -> dict[str, Any]:
    """One process's share of an arm, sent on its own client: `take` gives it the schedule's
    requests, `subscribers` get its records, and `go` (once the client is ready) waits for the
    start and returns the arm clock's start on this process's monotonic clock. Returns what
    the process saw: client_health, warnings, aborted, interrupted."""
    from rich.console import Console

    quiet = RunProgress(Console(file=open(os.devnull, "w"), force_terminal=False))  # noqa: SIM115
    sc = job.spec.scenario
    async with client_for(job.connections, sc.endpoint, job.headers, job.send_clock) as client:
        sender = Sender(
            spec=job.spec,
            client=client,
            builder=PromptBuilder(_no_count, sc.prompts.seed, sc.prompts.tolerance, 0),
            progress=quiet,
            stop=stop,
            rng=random.Random(f"{job.spec.run_id}/{job.spec.arm.name}/{job.index}/{random.SystemRandom().random()}"),
            seq=job.index * ID_STRIDE,  # request ids stay unique until the merge renumbers them
            subscribers=subscribers,
        )
        monitor = LoopMonitor(active=lambda: sender.in_flight > 0)
        aio.freeze_heap()
        t0_ns = await go()
        sender.spec = replace(sender.spec, clock=replace(sender.spec.clock, t0_ns=t0_ns))
        monitor.start()
        drive = kinds.get(job.kind).drive(sender, job.plan, take, job.connections, job.first_connection)
        await aio.until_done_or_stopped(drive, stop)
        health = monitor.stop()
    health.update(client.health())
    return {
        "client_health": health,
        "warnings": sender.warnings,
        "aborted": sender.aborted,
        "interrupted": stop.is_set(),
    }


async def _no_count(_text: str) -> int:
    raise RuntimeError("a worker process never builds prompts")


def deal(n_items: int, n: int) -> list[int]:
    """n near-equal shares of n_items (the first ones get the remainder)."""
    return [n_items // n + (1 if k < n_items % n else 0) for k in range(n)]


class WorkerPool:
    """The arm of `sender` over n processes; their records end up in `sink`, merged in start
    order. `ready()` starts them and waits until each can send; `run(clock)` starts them all on
    `clock` (just started) and returns the processes' combined client health."""

    def __init__(self, sender: Sender, kind: str, plan: Plan, n: int, sink: RunWriter, send_clock: bool) -> None:
        self.sender, self.plan, self.sink = sender, plan, sink
        spec = sender.spec
        shares = deal(spec.connections, n)
        ctx = multiprocessing.get_context("spawn")
        self.sync = Sync(
            ctx.Value("q", 0), ctx.Semaphore(0), ctx.Event(), ctx.Value("q", 0), ctx.Value("q", 0), ctx.Array("b", n)
        )
        headers = dict(sender.client.headers)
        self.jobs = [
            Job(k, spec, kind, headers, plan, shares[k], sum(shares[:k]), send_clock, sink.folder) for k in range(n)
        ]
        self.procs = [ctx.Process(target=_main, args=(job, self.sync), daemon=True) for job in self.jobs]

    async def ready(self) -> None:
        for p in self.procs:
            p.start()
        ready = 0
        try:
            while ready < len(self.procs) and all(p.is_alive() for p in self.procs):
                ready += await asyncio.to_thread(self.sync.ready.acquire, True, 0.2)
        except BaseException:
            await self._end()
            raise

    async def run(self, clock: ModelClock) -> dict[str, Any]:
        sender = self.sender
        sender.progress.start(f"{sender.spec.arm.name} ({len(self.procs)} processes)", self.plan.total)
        offsets: dict[int, int] = {}
        self.sync.t0_ns.value = clock.t0_ns
        self.sync.go.set()  # also when one died before it was ready: the others go on without it
        try:
            while any(p.is_alive() for p in self.procs):
                await asyncio.sleep(0.5)
                _progress(sender.progress, self.jobs, offsets)
                for k, p in enumerate(self.procs):
                    if not p.is_alive():  # gone before an open loop's start line: not waited for
                        self.sync.arrived[k] = 1
        finally:
            healths = await self._end()
        return combine_health(healths, len(self.jobs))

    async def _end(self) -> list[dict[str, Any]]:
        for k in range(len(self.procs)):  # nobody waits at an open loop's start line any more
            self.sync.arrived[k] = 1
        for p in self.procs:  # stopped early (Ctrl-C, failure): they finish what is in flight
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGINT)
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(timeout=aio.GRACE_S + 10)
            if p.is_alive():
                p.kill()
                p.join()
        return _merge(self.sender, self.jobs, self.sink)


def _progress(progress: RunProgress, jobs: list[Job], offsets: dict[int, int]) -> None:
    """Advance the bar by the lines the part files gained since the last look (read from where
    that look stopped: the files grow for the whole run)."""
    for job in jobs:
        data = _lines_since(job.part, offsets.get(job.index, 0))
        offsets[job.index] = offsets.get(job.index, 0) + len(data)
        for _ in range(data.count(b"\n")):
            progress.advance(True, None)


def _lines_since(path: Path, at: int) -> bytes:
    """The whole lines a growing file has after byte `at` (a record still being written comes
    next time; none while the file is not there)."""
    try:
        with path.open("rb") as f:
            f.seek(at)
            data = f.read()
    except FileNotFoundError:
        return b""
    return data[: data.rfind(b"\n") + 1]


def _merge(sender: Sender, jobs: list[Job], sink: RunWriter) -> list[dict[str, Any]]:
    records: list[RequestRecord] = []
    healths = []
    for job in jobs:
        if job.part.exists():
            records += read_requests(job.part)
        meta = job.folder / f"requests.part-{job.index}.json"
        if meta.exists():
            info = json.loads(meta.read_text())
            healths.append(info["client_health"])
            sender.warnings.extend(w for w in info["warnings"] if w not in sender.warnings)
            sender.aborted = sender.aborted or info["aborted"]
            meta.unlink()
    for r in records:
        sink.add(r)
    sink.reorder()
    for job in jobs:
        job.part.unlink(missing_ok=True)
    return healths


def combine_health(healths: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """One client_health for the run: the worst loop lag and CPU of any process."""

    def worst(key: str, sub: str) -> float | None:
        vals = [h[key][sub] for h in healths if h[key][sub] is not None]
        return max(vals) if vals else None

    warnings = [h["warning"] for h in healths if h["warning"]]
    return {
        "processes": n,
        **{k: healths[0][k] for k in ("transport", "transport_reason", "stamping") if k in healths[0]},
        "connections": ONE_PER_REQUEST if any(h.get("connections") == ONE_PER_REQUEST for h in healths) else KEPT_ALIVE,
        "loop_lag_ms": {
            "p50": worst("loop_lag_ms", "p50"),
            "p99": worst("loop_lag_ms", "p99"),
            "max": worst("loop_lag_ms", "max"),
            "samples": sum(h["loop_lag_ms"]["samples"] for h in healths),
        },
        "cpu_share_of_one_core": {
            "mean": worst("cpu_share_of_one_core", "mean"),
            "max": worst("cpu_share_of_one_core", "max"),
        },
        "cores": os.cpu_count(),
        "warning": warnings[0] if warnings else None,
        "per_process": healths,
    }
