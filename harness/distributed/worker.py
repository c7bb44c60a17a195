"""A worker's side of a distributed arm, whatever launched it (a process of `--workers`, an actor
of `--ray`): its share of the connections, sent on its own client and event loop (`send_share`),
the schedule taken from the coordinator's Dispatch in batches (dispatch.FedOrder), and its
records and heartbeats handed to a thread that ships them (`WorkerSide`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from harness.core import aio
from harness.distributed.dispatch import FedOrder, tagged
from harness.distributed.messages import (
    LAST_WORDS,
    Alive,
    Ended,
    Event,
    Failed,
    Go,
    Items,
    ReadyAt,
    Records,
    Share,
    StartAt,
    Stop,
    Told,
    Up,
    Want,
)
from harness.inputs.prompts import PromptBuilder
from harness.monitor.progress import RunProgress
from harness.monitor.selfcheck import LoopMonitor
from harness.results import RequestRecord
from harness.wire.client import KEPT_ALIVE, ONE_PER_REQUEST, client_for
from harness.workloads.base import Schedule, Sender
from harness.workloads.kind import driver

# The ids a worker gives its requests start at index x ID_STRIDE, unique until the coordinator
# renumbers them in start order.
ID_STRIDE = 10**9
# How often a worker hands its finished records on (s), unless its launcher says otherwise
# (Pool.flush_s): a record reaches the coordinator's file this long after it ended, at most (plus
# the trip); one message per flush, not per record.
FLUSH_S = 0.1
# A worker with nothing to send says it is alive this often (s): an empty batch of records.
HEARTBEAT_S = 1.0


def hold_after_s(lost_after_s: float) -> float:
    """How long a worker goes without a word from the coordinator before it hands out no new
    request (the dead-man's switch), and how old a word may be when it comes: less than the
    silence after which the coordinator declares it lost. That silence counts from the worker's
    last message, which came no earlier than the coordinator's last word (a fetch under Ray), so
    a worker frozen and thawed once it has been declared lost finds itself holding, whatever
    word from before its freeze is still on its way. Half a heartbeat is the margin for that
    word's trip; the coordinator's word comes at least once a heartbeat."""
    return lost_after_s - HEARTBEAT_S / 2


# What a worker hands its shipping thread (messages.py): `Up` once it can send; its asks of the
# Dispatch (`Want`, `ReadyAt`: its launcher carries them there); `Records`, empty as a heartbeat;
# last `Ended` or `Failed`.
Outgoing = Event | Want | ReadyAt
Outbox = queue.SimpleQueue


class WorkerSide:
    """One worker's share of an arm, in its client's event loop. What is said to it comes to `hear`
    (from another thread: `hear_threadsafe`): a batch of the schedule (`Items`), the arm's start
    (`Go`, coordinator ns), an open loop's start line (`StartAt`), `Stop` (or `Stop(now=True)`).
    Everything it says, its asks of the Dispatch included, goes into `out` for its launcher to
    carry."""

    def __init__(self, share: Share, out: Outbox[Outgoing]) -> None:
        self.share, self.offset_ns, self.out = share, share.offset_ns, out
        self.loop = asyncio.get_running_loop()
        self.stop = aio.Stopping()
        self.go_at: asyncio.Future[int] = self.loop.create_future()
        timed = share.plan.timed
        times = [share.spec.clock.wall_s(t) for t in timed.times] if timed else []
        quiet_ns = round(hold_after_s(share.lost_after_s) * 1e9)
        self.order = FedOrder(
            out.put,
            share.index,
            times,
            share.kind,
            share.connections,
            share.offset_ns,
            share.batch_s,
            quiet_ns=quiet_ns,
        )
        self.pending: list[bytes] = []
        self.shipped_ns = time.perf_counter_ns()

    def hear(self, said: Told) -> None:
        if isinstance(said, Alive | Go):  # the coordinator's own word
            self.order.hear()
        match said:
            case Items(items, seq):
                self.order.arrive([(i, p) for i, p in items], seq)
            case Go(t0_ns):
                _resolve(self.go_at, t0_ns + self.offset_ns)
            case StartAt(ns):
                self.order.start_at(ns)
            case Stop(now):
                if now:
                    self.stop.hurry()
                self.stop.set()
                _resolve(self.go_at, time.perf_counter_ns())
                self.order.end()

    def hear_threadsafe(self, said: Told) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.hear, said)

    async def run(self) -> Ended:
        """The share, sent: what send_share saw. Its records go out every flush_s as they end."""
        flusher = asyncio.ensure_future(self._flush_every())
        try:
            end = await send_share(self.share, self.order, self.stop, [self._keep], self._go)
        finally:
            flusher.cancel()
            self._flush(heartbeat=False)
        return end

    async def _go(self) -> int:
        self.out.put(Up())
        return await self.go_at

    def _keep(self, r: RequestRecord) -> None:
        self.pending.append(tagged(replace(r, process=self.share.index)))

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(self.share.flush_s)
            self._flush(heartbeat=True)

    def _flush(self, heartbeat: bool) -> None:
        now = time.perf_counter_ns()
        if self.pending or (heartbeat and now - self.shipped_ns >= HEARTBEAT_S * 1e9):
            self.out.put(Records(b"".join(self.pending)))
            self.pending.clear()
            self.shipped_ns = now


def _resolve(fut: asyncio.Future[int], value: int) -> None:
    if not fut.done():
        fut.set_result(value)


async def serve(side: WorkerSide) -> None:
    """A worker's arm from start to end, its last word in its outbox (`Ended` or `Failed`)."""
    try:
        end = await side.run()
    except Exception as e:  # told, not raised: the coordinator records it as the worker's loss
        side.out.put(Failed(f"{type(e).__name__}: {e}"))
    else:
        side.out.put(end)


def process_main(conn: Connection) -> None:
    """A worker process (of `--workers`, or one a Ray worker starts): its share and clock offset
    come first over `conn` (a pipe to the coordinator, or to its Ray actor), then what the
    coordinator says; what it says goes back from a thread of its own, so that a full pipe never
    stalls its sends. No Ray in it: Ray's threads taking Python's lock would hold its loop."""
    # The coordinator stops it (a Ctrl-C reaches the whole process group): it finishes what is in
    # flight when told, and ends by itself when the coordinator is gone (the pipe closes).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        share: Share = conn.recv()
    except EOFError:  # whoever started it is gone
        return
    out: Outbox[Outgoing] = Outbox()
    shipping = threading.Thread(target=_ship, args=(out, conn), name="kvbench-ship", daemon=True)
    shipping.start()
    aio.run(_serve(share, conn, out))
    shipping.join()


async def _serve(share: Share, conn: Connection, out: Outbox[Outgoing]) -> None:
    side = WorkerSide(share, out)
    # read by a thread of its own, as the shipping thread writes: the pipe stays blocking (an
    # event loop's reader would make it non-blocking, and a large message then fails half sent)
    hearing = threading.Thread(
        target=hear_pipe, args=(conn, side.hear_threadsafe, Stop()), name="kvbench-hear", daemon=True
    )
    hearing.start()
    await serve(side)


def hear_pipe(conn: Connection, hear: Callable[[Any], None], gone: Any) -> None:
    """Every message on `conn`, to `hear`, then `gone` once the other end is gone."""
    with contextlib.suppress(EOFError, OSError):
        while True:
            hear(conn.recv())
    with contextlib.suppress(RuntimeError):  # the loop is closed: it ended meanwhile
        hear(gone)


def _ship(out: Outbox[Outgoing], conn: Connection) -> None:
    while True:
        said = out.get()
        try:
            conn.send(said)
        except (OSError, ValueError):  # the coordinator is gone
            return
        if isinstance(said, LAST_WORDS):
            return


async def send_share(
    job: Share,
    take: Schedule,
    stop: aio.Stopping,
    subscribers: list[Callable[[RequestRecord], None]],
    go: Callable[[], Awaitable[int]],
) -> Ended:
    """One worker's share of an arm, sent on its own client: `take` gives it the schedule's
    requests, `subscribers` get its records, and `go` (once the client is ready) waits for the
    start and returns the arm clock's start on this host's monotonic clock. Returns what the
    worker saw: client_health, warnings, aborted, interrupted."""
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
            seq=job.index * ID_STRIDE,  # request ids stay unique until the coordinator renumbers them
            subscribers=subscribers,
        )
        monitor = LoopMonitor(active=lambda: sender.in_flight > 0)
        aio.freeze_heap()
        t0_ns = await go()
        sender.spec = replace(sender.spec, clock=replace(sender.spec.clock, t0_ns=t0_ns))
        monitor.start()
        drive = driver(job.kind).drive(sender, job.plan, take, job.connections, job.first_connection)
        await aio.until_done_or_stopped(drive, stop, cut=stop.now)
        health = monitor.stop()
    health.update(client.health())
    return Ended(health, sender.warnings, sender.aborted, stop.is_set())


async def _no_count(_text: str) -> int:
    raise RuntimeError("a worker never builds prompts")


def deal(n_items: int, n: int) -> list[int]:
    """n near-equal shares of n_items (the first ones get the remainder)."""
    return [n_items // n + (1 if k < n_items % n else 0) for k in range(n)]


def combine_health(healths: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """One client_health for the run: the worst loop lag and CPU of any worker."""

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
