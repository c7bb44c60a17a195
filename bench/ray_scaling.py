"""What sending through Ray costs: the client's ceiling (streamed requests per second, 256
output tokens each, against bench/firehose.py pinned to core 1) with one process, one Ray
worker, `--workers 2` and two Ray workers, alternated in each of 3 rounds, with the ratios; then
an open loop (Poisson arrivals at 50 % and at 80 % of the one process's ceiling) over two
processes, over two processes beside an idle Ray cluster on the same cores ("beside": what Ray's
own processes cost their timing, without kvbench using Ray) and over two Ray workers, with its
schedule lag p99 over all workers and per worker; last the open loop over two workers apart
(`open_apart`: both senders on core 0, what coordinates them on core 1, as on client hosts of
their own), `--workers 2` against two Ray workers in pairs on one cluster; and one process and
one Ray worker apart beside a busy loop on the client core (`beside_busy`: another tenant of the
host), what each gets of that core.

One process and one Ray worker run on core 0 (the coordinator and the Ray cluster's own
processes too: what they cost is part of the price here, where on client hosts the coordinator
has a host of its own); "1, apart" is one Ray worker on core 0 with the coordinator and the head
node on core 1 beside the server, as on a host of their own; two of either run on both cores,
sharing core 1 with the server. The cluster is local (ray.cluster_utils: a head node without
CPUs, and a node per worker), started afresh for each run and let settle. "Sender CPU per
request" is the sending processes' own CPU time per request, without the coordinator's: what
every further worker costs (a Ray worker's is its worker process's; its actor, which relays the
process's pipe as Ray calls, and its node's raylet are not in it). "Share of a core" is what each
sending process had of a core, on average: where it has a core of its own, the rest of that core
went to what coordinates it (a Ray worker's actor, its node's raylet). Unlike req/s, which moves
with this host's speed (by 10-20 % within minutes
here), that ratio is the same in every round within a percent or so: it is the steadiest figure
of what a worker costs its host.

A ceiling is a steady rate, so each run is long (20,000 requests, 8 s at 2,500 req/s): in a run of
a second or two, the closed loop's last batches (a round trip each, while connections wait)
weigh several percent. But this host's speed moves within a minute, so the ratio of two such runs
moves by 10-20 %: the bench therefore also runs one process and one Ray worker apart in PAIRS
pairs of shorter runs in turns on one cluster, and gives the median ratios with a bootstrap
interval, and where the client core went in them (`CoreUse`: a Ray worker's actor, which is
kvbench's coordination of it, beside what a worker actor takes at rest, which is Ray's).

    python bench/ray_scaling.py [requests]      # default 20000
    python bench/ray_scaling.py pairs [requests]  # the pairs only (default 24000 requests per run)
    python bench/ray_scaling.py apart RATE [requests]  # the open loop's pairs only (default 5000)
    python bench/ray_scaling.py busy [requests]  # beside a busy loop on the client core only (default 2000)
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from common import POISSON, SERVER_CORE, STREAMING, Firehose, client_cores, kvbench_run, pin, process_cpu_s

from harness.analysis.stats import CI_LEVEL, STATISTICS, bootstrap_ci
from harness.distributed.raypool import WORKER_ENTRY

ROUNDS = 3
# The pairs (one process, one Ray worker apart) in turns on one cluster, and their requests: runs
# short enough that a pair sees this host at one speed, long enough that the CPU times, which Linux
# gives in ticks of 10 ms, resolve the actor's share: over the middle of an 8,000-request run (some
# 1.5 s) it moved in steps of 0.7 points of a core, about a quarter of the 3 % it is held to.
PAIRS = 12
PAIR_REQUESTS = 24000
# The open loop's pairs (two workers apart, `open_apart`): requests per run.
OPEN_PAIR_REQUESTS = 5000
# Requests per run beside a busy loop (`beside_busy`): a sender with half a core, or less.
BUSY_REQUESTS = 2000
CONNECTIONS = 28  # per worker, as bench/ceiling.py
# Open-loop rates, shares of the one process's ceiling: at 80 % this 2-core machine, with the
# server and Ray's processes on it, has no CPU to spare, and a worker that falls behind stays behind.
OPEN_SHARES = (0.5, 0.8)
# The open loop of two workers apart (`open_apart`), whose two workers share one core: a share of
# the one process's ceiling that leaves that core about half idle, as OPEN_SHARES[0] leaves two.
APART_SHARE = 0.25


@contextlib.contextmanager
def ray_cluster(workers: int, cores: set[int], head_cores: set[int] | None = None) -> Iterator[tuple[str, list[int]]]:
    """A local Ray cluster whose processes (and the actors they start) run on `cores` (its head
    node's on `head_cores` if given), settled: a cluster just started
    spends seconds of CPU on its agents and on idle workers it starts ahead (not started here),
    which a long-running cluster of client hosts has done long before. Yields its address and its
    worker nodes' raylets."""
    from ray.cluster_utils import Cluster

    mine = os.sched_getaffinity(0)
    os.environ.update(RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0")
    try:
        pin(head_cores or cores)
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
        pin(cores)
        nodes = [c.add_node(num_cpus=1) for _ in range(workers)]
        c.wait_for_nodes()
    finally:
        pin(mine)
    try:
        settle()
        yield c.address, [n.all_processes["raylet"][0].process.pid for n in nodes]
    finally:
        c.shutdown()


def children() -> dict[int, list[int]]:
    """Each process's children, now."""
    found: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            found.setdefault(int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(p.name))
    return found


def tree(root: int) -> list[int]:
    """Process `root` and the processes it started, and theirs."""
    kids = children()
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += kids.get(pid, [])
    return found


@contextlib.contextmanager
def grandchildren_onto(cores: set[int], expect: int) -> Iterator[None]:
    """While it lasts, the first `expect` worker processes that this process's children start
    (`kvbench run --workers`'s, multiprocessing's spawn; not its resource tracker) are moved onto
    `cores` as they appear (within 20 ms, long before one has imported kvbench): the coordinator
    stays where it was started."""
    done = threading.Event()
    moved: set[int] = set()

    def watch() -> None:
        while len(moved) < expect and not done.wait(0.02):
            kids = children()
            for pid in (g for c in kids.get(os.getpid(), []) for g in kids.get(c, [])):
                with contextlib.suppress(OSError):
                    if pid not in moved and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        move(pid, cores)
                        moved.add(pid)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def move(root: int, cores: set[int]) -> None:
    """Every thread of process `root` and of the processes it started onto `cores`."""
    for pid in tree(root):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), cores)


def at_rest(root: int, seconds: float = 10.0) -> float:
    """The share of a core that process `root` and what it started take over `seconds` of doing
    nothing asked of them (a Ray node's raylet and its agents: the price of the node being there,
    with or without kvbench)."""

    def cpu_s() -> float:
        total = 0.0
        for pid in tree(root):
            with contextlib.suppress(OSError):  # it ended meanwhile
                total += process_cpu_s(pid)
        return total

    before, t0 = cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (cpu_s() - before) / (time.monotonic() - t0)


def actor_at_rest(address: str) -> float:
    """The share of a core a worker actor takes started as a run starts it and asked nothing
    (Ray's machinery for an actor: its threads, the main one woken about 100 times a second),
    on the cluster's worker node."""
    import ray

    from harness.distributed.raypool import worker_actor

    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        actor = worker_actor().remote()
        pid = ray.get(actor.info.remote())["pid"]
        time.sleep(2)  # what its start left to do
        return at_rest(pid)
    finally:
        ray.shutdown()


def settle(quiet: float = 0.05, longest_s: float = 30.0) -> None:
    """Wait until the machine's CPUs are idle but for `quiet` of their time over half a second."""
    deadline = time.monotonic() + longest_s
    while time.monotonic() < deadline:
        idle0, _, total0 = cpu_ticks()
        time.sleep(0.5)
        idle1, _, total1 = cpu_ticks()
        if 1 - (idle1 - idle0) / max(1, total1 - total0) < quiet:
            return


def pairs(n: int) -> None:
    """One process against one Ray worker apart, PAIRS times each in turns (ABBA), on one cluster
    whose worker node (raylet, agents) is moved onto the server's core while the process runs:
    both see this host at the same speed within seconds, so their ratios are steadier than the
    rounds', and a bootstrap interval says how far they can be trusted. Beside each run, where the
    client core went (`CoreUse`): a Ray worker's actor is kvbench's coordination of it, measured
    directly rather than as what the worker's process did not have of the core."""
    got: dict[str, list[dict[str, Any]]] = {"process": [], "ray apart": []}
    client, scenario = client_cores(1), STREAMING.format(name="ray", requests=n, concurrency=CONNECTIONS)
    mine = os.sched_getaffinity(0)
    pin({SERVER_CORE})  # this process samples the client core: not from it
    try:
        with Firehose(ttft_ms=0, tokens=256) as fh, ray_cluster(1, client, {SERVER_CORE}) as (address, (raylet,)):
            rest, idle_actor = at_rest(raylet), actor_at_rest(address)
            for k in range(PAIRS):
                for how in ("process", "ray apart") if k % 2 == 0 else ("ray apart", "process"):
                    got[how].append(one_or_apart(scenario, fh, address, raylet, how == "ray apart"))
    finally:
        pin(mine)
    print(f"\none Ray worker apart / one process: {PAIRS} pairs of {n} requests in turns, on one cluster")
    paired_ratios(
        got["ray apart"],
        got["process"],
        (("rps", "req/s"), ("cpu_ms", "sender CPU per request"), ("share", "its share of a core")),
    )
    print(
        f"  the worker's node at rest before the runs (its raylet and agents, nothing asked of them): {rest:.1%} "
        "of a core, part of what the worker's process did not have of its core"
    )
    print(f"where the client core went, the middle {CoreUse.MIDDLE:.0%} of each run (medians of {PAIRS}, min-max):")
    for how, label in (("process", "one process"), ("ray apart", "one Ray worker apart")):
        parts = [part for part in CoreUse.PARTS if any(r["core"][part] for r in got[how])]
        print(f"  {label}: " + "; ".join(spread(part, [r["core"][part] for r in got[how]]) for part in parts))
    print(
        "  (the actor is kvbench's coordination of its worker: the relay of the worker process's pipe, its Ray calls "
        f"and Ray's machinery for an actor, which a worker actor started and asked nothing takes: {idle_actor:.1%} "
        "of the core; the node is Ray's: the raylet and its agents; steal is what the VM's host took)"
    )


def spread(label: str, xs: list[float]) -> str:
    return f"{label} {statistics.median(xs):.1%} ({min(xs):.1%}-{max(xs):.1%})"


class CoreUse:
    """Where a core went while a run sent: the CPU time of each process this one started (the
    run, the cluster, the server), by what it is (the sending process; a Ray worker's actor; its
    node, the raylet's tree), the core's idle time and what the VM's host took of it (steal),
    sampled every EVERY_S and taken over the middle MIDDLE of the sending process's life (its
    start and end are not its ceiling). Shares of the core; `other` is the rest (the kernel's
    work, anything else on it)."""

    EVERY_S = 0.5
    MIDDLE = 0.6
    PARTS = ("sender", "actor", "node", "idle", "steal", "other")

    def __init__(self, core: int, raylet: int | None) -> None:
        self.core = core
        self.node = frozenset(tree(raylet)) if raylet is not None else frozenset()
        self.samples: list[tuple[float, dict[int, tuple[str, float]], tuple[int, int, int]]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CoreUse:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()

    def _sample(self) -> None:
        while not self.done.wait(self.EVERY_S):
            procs: dict[int, tuple[str, float]] = {}
            for pid in tree(os.getpid()):
                with contextlib.suppress(OSError, ValueError, IndexError):  # it ended meanwhile
                    procs[pid] = (self._what(pid), process_cpu_s(pid))
            self.samples.append((time.monotonic(), procs, cpu_ticks(self.core)))

    def _what(self, pid: int) -> str:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        ray_worker = WORKER_ENTRY.encode() in argv or any(b"process_main" in a for a in argv)
        if ray_worker or (b"harness" in argv and b"--ray" not in argv):
            return "sender"  # a Ray worker's process, or one process's run
        if argv[0].startswith(b"ray::RayWorker"):
            return "actor"
        return "node" if pid in self.node else "else"

    def shares(self) -> dict[str, float]:
        """Each part's share of the core over the middle of the sender's life."""
        alive = [s for s in self.samples if any(what == "sender" for what, _ in s[1].values())]
        if len(alive) < 3:
            raise SystemExit("bench: a run too short to sample where the core went: give it more requests")
        skip = (1 - self.MIDDLE) / 2
        (t0, p0, c0), (t1, p1, c1) = alive[int(len(alive) * skip)], alive[int(len(alive) * (1 - skip))]
        got = dict.fromkeys(self.PARTS, 0.0)
        for pid, (what, cpu) in p1.items():
            if what in got and pid in p0:
                got[what] += (cpu - p0[pid][1]) / (t1 - t0)
        ticks = (c1[2] - c0[2]) or 1
        got["idle"], got["steal"] = (c1[0] - c0[0]) / ticks, (c1[1] - c0[1]) / ticks
        got["other"] = max(0.0, 1 - sum(got.values()))
        return got


def cpu_ticks(core: int | None = None) -> tuple[int, int, int]:
    """Core `core`'s idle (with I/O wait), steal and total ticks so far, or all cores' (/proc/stat)."""
    want = "cpu" if core is None else f"cpu{core}"
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name == want:
            v = [int(x) for x in values]
            return v[3] + v[4], v[7], sum(v[:8])  # guest time is in user time already
    raise SystemExit(f"bench: no {want} in /proc/stat")


def one_or_apart(scenario: str, fh: Firehose, address: str, raylet: int, ray: bool) -> dict[str, Any]:
    """One run of one process on the client core, or of one Ray worker apart: its node (raylet,
    agents, actor, worker process) on the client core, the coordinator and the head node on the
    server's; the node is moved onto the server's core while the process runs."""
    client = client_cores(1)
    move(raylet, client if ray else {SERVER_CORE})
    extra = ["--ray", address, "--workers", "1"] if ray else []
    with tempfile.TemporaryDirectory() as tmp:
        with CoreUse(min(client), raylet if ray else None) as use:
            (folder,) = kvbench_run(scenario, fh.base_url, Path(tmp), extra, {SERVER_CORE} if ray else client)
        return {**measured(json.loads((folder / "run.json").read_text())), "core": use.shares()}


def open_apart(rate: int, n: int) -> None:
    """An open loop at `rate` over two workers whose coordination is apart, as on client hosts of
    their own, PAIRS times each in turns on one cluster: `--workers 2` with its worker processes on
    the client core and the coordinator on the server's; two Ray workers with their nodes (raylet,
    agents, actor, worker process) on the client core and the coordinator (with the Dispatch) and
    the head node on the server's. What differs is only what Ray puts on a worker's host. Both nodes
    are moved onto the server's core while the processes run, and this process (its watch for the
    worker processes, the Ray client threads of its cluster) stays there too."""
    client = client_cores(1)
    got: dict[str, list[dict[str, Any]]] = {"--workers 2": [], "2 Ray workers": []}
    scenario = POISSON.format(name="ray-open", rate=rate, requests=n)
    mine = os.sched_getaffinity(0)
    pin({SERVER_CORE})
    try:
        with Firehose(ttft_ms=0, tokens=256) as fh, ray_cluster(2, client, {SERVER_CORE}) as (address, raylets):
            for k in range(PAIRS):
                for how in list(got) if k % 2 == 0 else list(got)[::-1]:
                    ray = how == "2 Ray workers"
                    for raylet in raylets:
                        move(raylet, client if ray else {SERVER_CORE})
                    settle()  # a Ray run's end (its job's processes ending) is not the next run's start
                    extra = ["--ray", address, "--workers", "2"] if ray else ["--workers", "2"]
                    moving = contextlib.nullcontext() if ray else grandchildren_onto(client, 2)
                    with tempfile.TemporaryDirectory() as tmp, moving:
                        (folder,) = kvbench_run(scenario, fh.base_url, Path(tmp), extra, {SERVER_CORE})
                        got[how].append(measured(json.loads((folder / "run.json").read_text())))
    finally:
        pin(mine)
    print(
        f"\nopen loop, Poisson at {rate} req/s, two workers apart: {PAIRS} pairs of {n} requests in turns, one cluster"
    )
    for how, runs in got.items():
        lags = [r["lag_p99_ms"] for r in runs]
        print(f"  {how}: schedule lag p99 median {statistics.median(lags):.2f} ms ({min(lags):.2f}-{max(lags):.2f})")
    paired_ratios(
        got["2 Ray workers"], got["--workers 2"], (("lag_p99_ms", "2 Ray workers / --workers 2, schedule lag p99"),)
    )


def beside_busy(n: int) -> None:
    """One process against one Ray worker apart, ROUNDS times each in turns, with a busy loop
    (another tenant of a client host, at the same niceness as the rest of it) on the client core:
    what each sender gets of its core when it is not alone there."""
    client = client_cores(1)
    got: dict[str, list[dict[str, Any]]] = {"one process": [], "1 Ray worker apart": []}
    scenario = STREAMING.format(name="ray", requests=n, concurrency=CONNECTIONS)
    with Firehose(ttft_ms=0, tokens=256) as fh, ray_cluster(1, client, {SERVER_CORE}) as (address, (raylet,)):
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=functools.partial(pin, client))
        try:
            for _ in range(ROUNDS):
                for how in got:
                    got[how].append(one_or_apart(scenario, fh, address, raylet, how != "one process"))
        finally:
            hog.kill()
            hog.wait()
    print(f"\nbeside a busy loop on the client core: {ROUNDS} rounds of {n} requests")
    for how, runs in got.items():
        rps, share = statistics.median(r["rps"] for r in runs), statistics.median(r["share"] for r in runs)
        print(f"  {how}: {rps:.0f} req/s, {share:.1%} of a core (medians)")


def paired_ratios(runs: list[dict[str, Any]], base: list[dict[str, Any]], keys: tuple[tuple[str, str], ...]) -> None:
    """The median of the pairs' ratios of each key, with its bootstrap interval."""
    for key, label in keys:
        r = np.array([a[key] / b[key] for a, b in zip(runs, base, strict=True)])
        low, high = bootstrap_ci((r,), STATISTICS["p50"]) or (math.nan, math.nan)
        print(
            f"  {label}: median {float(np.median(r)):.3f}x ({CI_LEVEL:.0%} interval {low:.3f}-{high:.3f}; "
            f"pairs {r.min():.3f}-{r.max():.3f})"
        )


def measured(meta: dict[str, Any]) -> dict[str, Any]:
    """A run's req/s, its senders' CPU per request and share of a core, and its schedule lag."""
    health = meta["client_health"]
    per = [
        (h.get("worker", i), h["cpu_share_of_one_core"]["mean"] or 0.0)
        for i, h in enumerate(health.get("per_process") or [health])
    ]
    lag = meta["summary"].get("schedule_lag") or {}
    by_worker = {  # each worker's own, as run.json keeps it
        h.get("worker", i): h["schedule_lag"]["p99_s"] * 1e3
        for i, h in enumerate(health.get("per_process") or [])
        if (h.get("schedule_lag") or {}).get("p99_s") is not None
    }
    s = meta["summary"]
    return {
        "rps": s["req_per_s"],
        # CPU seconds of the sending processes (or workers) per request, ms
        "cpu_ms": sum(c for _, c in per) * s["duration_s"] / s["requests"] * 1e3 if "duration_s" in s else None,
        # what each sending process had of a core, on average: on a core of its own, the rest
        # went to what coordinates it (a Ray worker's actor, the node's raylet)
        "share": sum(c for _, c in per) / len(per),
        "lag_p99_ms": lag["p99_s"] * 1e3 if lag.get("p99_s") is not None else None,
        "lag_by_worker": by_worker,
        "sent": lag.get("sent_req_per_s"),
    }


def once(scenario: str, how: str, workers: int) -> dict[str, Any]:
    """One run: `how` is "process" (--workers), "ray", "ray apart" (the coordinator and the
    head node on the server's core, as on a host of their own), or "beside" (--workers with an idle
    Ray cluster on the same cores: what Ray's own processes cost the processes' timing)."""
    cores = client_cores(workers)
    with tempfile.TemporaryDirectory() as tmp, Firehose(ttft_ms=0, tokens=256) as fh:
        with contextlib.ExitStack() as stack:
            driver = cores
            if how != "process":
                apart = {SERVER_CORE} if how == "ray apart" else None
                address, _ = stack.enter_context(ray_cluster(workers, cores, apart))
            if how.startswith("ray"):
                extra = ["--ray", address, "--workers", str(workers)]
                driver = apart or cores
            else:
                extra = ["--workers", str(workers)] if workers > 1 else []
            (folder,) = kvbench_run(scenario, fh.base_url, Path(tmp), extra, cores=driver)
        return measured(json.loads((folder / "run.json").read_text()))


def main() -> None:
    if sys.argv[1:2] == ["pairs"]:
        pairs(int(sys.argv[2]) if len(sys.argv) > 2 else PAIR_REQUESTS)
        return
    if sys.argv[1:2] == ["busy"]:
        beside_busy(int(sys.argv[2]) if len(sys.argv) > 2 else BUSY_REQUESTS)
        return
    if sys.argv[1:2] == ["apart"]:
        open_apart(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else OPEN_PAIR_REQUESTS)
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    configs = [("one process", "process", 1), ("1 Ray worker", "ray", 1), ("1, apart", "ray apart", 1)]
    configs += [("--workers 2", "process", 2), ("2 Ray workers", "ray", 2)]
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in configs}
    for _ in range(ROUNDS):
        for label, how, w in configs:
            runs[label].append(once(STREAMING.format(name="ray", requests=n, concurrency=CONNECTIONS * w), how, w))
    med = statistics.median
    print("client            connections  req/s (median, min-max of 3)  sender CPU per request (ms)  share of a core")
    for label, _, w in configs:
        rps = [r["rps"] for r in runs[label]]
        cpu = med(r["cpu_ms"] for r in runs[label])
        share = med(r["share"] for r in runs[label])
        spread = f"({min(rps):.0f}-{max(rps):.0f})"
        print(f"{label:16s}  {CONNECTIONS * w:11d}  {med(rps):7.0f} {spread}{cpu:33.3f}{share:17.1%}")
    for ray_label, base in (
        ("1 Ray worker", "one process"),
        ("1, apart", "one process"),
        ("2 Ray workers", "--workers 2"),
    ):
        ratios = sorted(r["rps"] / b["rps"] for r, b in zip(runs[ray_label], runs[base], strict=True))
        cpu = sorted(r["cpu_ms"] / b["cpu_ms"] for r, b in zip(runs[ray_label], runs[base], strict=True))
        share = sorted(r["share"] / b["share"] for r, b in zip(runs[ray_label], runs[base], strict=True))
        print(
            f"  {ray_label} / {base}: req/s {ratios[1]:.3f}x (rounds {ratios[0]:.3f}-{ratios[-1]:.3f}); "
            f"sender CPU per request {cpu[1]:.3f}x; "
            f"its share of a core {share[1]:.3f}x ({share[0]:.3f}-{share[-1]:.3f})"
        )
    pairs(PAIR_REQUESTS)
    for share in OPEN_SHARES:
        rate = round(share * med(r["rps"] for r in runs["one process"]))
        print(f"\nopen loop, Poisson at {rate} req/s ({share:.0%} of one process's ceiling), {n} requests")
        print("client                sent req/s  schedule lag p99 ms (all)  per worker")
        for label, how in (("--workers 2", "process"), ("--workers 2, beside", "beside"), ("2 Ray workers", "ray")):
            for _ in range(ROUNDS):
                r = once(POISSON.format(name="ray-open", rate=rate, requests=n), how, 2)
                workers = ", ".join(f"{k}: {v:.2f}" for k, v in r["lag_by_worker"].items())
                print(f"{label:20s}  {r['sent']:10.0f}  {r['lag_p99_ms']:25.2f}  {workers}", flush=True)
    open_apart(round(APART_SHARE * med(r["rps"] for r in runs["one process"])), OPEN_PAIR_REQUESTS)
    beside_busy(BUSY_REQUESTS)


if __name__ == "__main__":
    main()
