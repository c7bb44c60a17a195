"""`kvbench run --workers N`: a closed loop sent by N processes, one event loop each, so that the
client can use more than one core. The connections are split as evenly as they go; whichever
connection of any process is free takes the next request of the schedule (one shared counter),
so a process on a busier core takes fewer and none idles at the end. All processes start
sending together, once each is ready. Each streams its requests to its own part file in the run
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness import aio
from harness.client import StreamingClient
from harness.drivers import ArmRun, closed_loop, schedule
from harness.progress import RunProgress
from harness.prompts import Prompt, PromptBuilder
from harness.scenario import Arm, Scenario
from harness.selfcheck import LoopMonitor

GRACE_S = 5.0


@dataclass(frozen=True)
class Job:
    index: int
    scenario: Scenario
    arm: Arm
    base_url: str
    model: str
    headers: dict[str, str]  # may hold the API key: travels through a pipe, never argv or disk
    pool: list[Prompt]
    order: list[tuple[int, int]]
    concurrency: int
    first_worker: int
    run_id: str
    t0_ns: int
    time_scale: float
    send_clock: bool
    server: str
    folder: Path

    @property
    def part(self) -> Path:
        return self.folder / f"requests.part-{self.index}.jsonl"


class SharedOrder:
    """The schedule, taken one request at a time by every connection of every process."""

    def __init__(self, order: list[tuple[int, int]], taken: Any) -> None:
        self.order, self.taken = order, taken  # taken: a multiprocessing Value("q")

    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> SharedOrder:
        return self

    def __next__(self) -> tuple[int, int]:
        with self.taken.get_lock():
            k = self.taken.value
            if k >= len(self.order):
                raise StopIteration
            self.taken.value = k + 1
        return self.order[k]


@dataclass(frozen=True)
class Sync:
    """What the processes share: the schedule's counter, and the start line."""

    taken: Any  # Value("q")
    ready: Any  # Semaphore: released by each process once it can send
    go: Any  # Event: set by the parent when all are ready


class _PartWriter:
    def __init__(self, path: Path, process: int) -> None:
        self.f = path.open("ab")
        self.process = process
        self.count = 0

    def add(self, record: dict[str, Any]) -> None:
        record["process"] = self.process
        self.f.write(orjson.dumps(record) + b"\n")
        self.f.flush()
        self.count += 1


def _main(job: Job, sync: Sync) -> None:
    aio.run(_run(job, sync))


async def _run(job: Job, sync: Sync) -> None:
    from rich.console import Console

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    writer = _PartWriter(job.part, job.index)
    quiet = RunProgress(Console(file=open(os.devnull, "w"), force_terminal=False))  # noqa: SIM115
    async with StreamingClient(
        job.concurrency, job.scenario.endpoint.timeouts, job.headers, send_clock=job.send_clock
    ) as client:
        run = ArmRun(
            scenario=job.scenario,
            arm=job.arm,
            client=client,
            base_url=job.base_url,
            model=job.model,
            builder=PromptBuilder(_no_count, job.scenario.prompts.seed, job.scenario.prompts.tolerance, 0),
            writer=writer,
            progress=quiet,
            stop=stop,
            t0_ns=job.t0_ns,
            time_scale=job.time_scale,
            run_id=job.run_id,
            rng=random.Random(f"{job.run_id}/{job.arm.name}/{job.index}/{random.SystemRandom().random()}"),
            server=job.server,
        )
        run._seq = job.index * 10**9  # request ids stay unique until the merge renumbers them
        monitor = LoopMonitor(active=lambda: run.in_flight > 0)
        aio.freeze_heap()
        sync.ready.release()
        while not sync.go.wait(0.05) and not stop.is_set():
            await asyncio.sleep(0)  # Ctrl-C before the start: the signal handler must run
        monitor.start()
        order = SharedOrder(job.order, sync.taken)
        task = asyncio.ensure_future(closed_loop(run, job.pool, order, job.concurrency, job.first_worker))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=GRACE_S)
            task.cancel()
        stopped.cancel()
        health = monitor.stop()
    (job.folder / f"requests.part-{job.index}.json").write_text(
        json.dumps(
            {
                "client_health": health,
                "warnings": run.warnings,
                "aborted": run.aborted,
                "interrupted": stop.is_set(),
            }
        )
    )


async def _no_count(_text: str) -> int:
    raise RuntimeError("a worker process never builds prompts")


def deal(n_items: int, n: int) -> list[int]:
    """n near-equal shares of n_items (the first ones get the remainder)."""
    return [n_items // n + (1 if k < n_items % n else 0) for k in range(n)]


async def run_workers(run: ArmRun, pool: list[Prompt], n: int, folder: Path, send_clock: bool) -> None:
    """The closed loop of `run` over n processes; their records end up in run.writer."""
    sc = run.scenario
    order = list(enumerate(schedule(sc)))
    shares = deal(sc.workload.concurrency, n)
    ctx = multiprocessing.get_context("spawn")
    sync = Sync(ctx.Value("q", 0), ctx.Semaphore(0), ctx.Event())
    jobs = [
        Job(
            k,
            sc,
            run.arm,
            run.base_url,
            run.model,
            dict(run.client.headers),
            pool,
            order,
            shares[k],
            sum(shares[:k]),
            run.run_id,
            run.t0_ns,
            run.time_scale,
            send_clock,
            run.server,
            folder,
        )
        for k in range(n)
    ]
    procs = [ctx.Process(target=_main, args=(job, sync), daemon=True) for job in jobs]
    for p in procs:
        p.start()
    run.progress.start(f"{run.arm.name} ({n} processes)", len(order))
    offsets: dict[int, int] = {}
    try:
        ready = 0
        while ready < n and all(p.is_alive() for p in procs):
            ready += await asyncio.to_thread(sync.ready.acquire, True, 0.2)
        sync.go.set()  # also when one died before it was ready: the others go on without it
        while any(p.is_alive() for p in procs):
            await asyncio.sleep(0.5)
            _progress(run, jobs, offsets)
    finally:
        for p in procs:  # stopped early (Ctrl-C, failure): they finish what is in flight
            if p.is_alive() and p.pid is not None:
                os.kill(p.pid, signal.SIGINT)
        for p in procs:
            p.join(timeout=GRACE_S + 10)
            if p.is_alive():
                p.kill()
                p.join()
        _merge(run, jobs)


def _progress(run: ArmRun, jobs: list[Job], offsets: dict[int, int]) -> None:
    """Advance the bar by the lines the part files gained since the last look (read from where
    that look stopped: the files grow for the whole run)."""
    for job in jobs:
        if not job.part.exists():
            continue
        with job.part.open("rb") as f:
            f.seek(offsets.get(job.index, 0))
            data = f.read()
        # only whole lines: a record still being written is counted next time
        complete = data.rfind(b"\n") + 1
        offsets[job.index] = offsets.get(job.index, 0) + complete
        for _ in range(data.count(b"\n", 0, complete)):
            run.progress.advance({"ok": True, "ttft_s": None})


def _merge(run: ArmRun, jobs: list[Job]) -> None:
    records: list[dict[str, Any]] = []
    healths = []
    for job in jobs:
        if job.part.exists():
            for line in job.part.read_bytes().splitlines():
                try:
                    records.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    continue
        meta = job.folder / f"requests.part-{job.index}.json"
        if meta.exists():
            info = json.loads(meta.read_text())
            healths.append(info["client_health"])
            run.warnings.extend(info["warnings"])
            run.aborted = run.aborted or info["aborted"]
            meta.unlink()
    records.sort(key=lambda r: r["start_s"])
    for i, r in enumerate(records, 1):
        r["id"] = i
        run.writer.add(r)
    for job in jobs:
        job.part.unlink(missing_ok=True)
    run.worker_health = _combine(healths, len(jobs))


def _combine(healths: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """One client_health for the run: the worst loop lag and CPU of any process."""

    def worst(key: str, sub: str) -> float | None:
        vals = [h[key][sub] for h in healths if h[key][sub] is not None]
        return max(vals) if vals else None

    warnings = [h["warning"] for h in healths if h["warning"]]
    return {
        "processes": n,
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
