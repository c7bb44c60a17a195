"""Runs the arms of a scenario against a resolved endpoint: it only orchestrates.

First one endpoint session (the model, the token counter, the prompt builder and its cache),
then for every arm one lifecycle: its folder and writer, metadata, before-hook, competing
traffic, server-metrics scraper, loop monitor, the workload itself (workloads/), and the
summary. Everything is kept on Ctrl-C or failure: records stream to disk as they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import signal
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.markup import escape

from harness.analysis import stats
from harness.analysis.kinds import figures_of
from harness.config import kinds, reference
from harness.config.context import Context
from harness.config.scenario import Arm, DistributedCfg, Scenario
from harness.core import aio
from harness.core.clock import ModelClock
from harness.core.errors import EndpointError, ExitCode, FilesError
from harness.core.units import human_bandwidth
from harness.distributed.launch import Interrupted, Launcher, launcher_for
from harness.engines import Started
from harness.inputs import hf_tokenizer, prompts
from harness.inputs.prompts import PromptBuilder
from harness.monitor import selfcheck
from harness.monitor.progress import RunProgress
from harness.monitor.selfcheck import LoopMonitor
from harness.results import REQUESTS, RunWriter, iso, machine, read_table, utc_stamp, versions
from harness.server import checks, endpoint, metrics
from harness.server.scrape import Scraper
from harness.traffic import make_driver
from harness.traffic.base import TrafficDriver, TrafficResult
from harness.wire.client import StreamingClient, client_for
from harness.wire.stamps import KERNEL_CLOCK
from harness.workloads.base import ArmSpec, Load, Plan, Sender
from harness.workloads.kind import ArmsDone, driver


@dataclass(frozen=True)
class Target:
    """What `kvbench run` resolved from the command line and the scenario."""

    scenario: Scenario
    arms: tuple[Arm, ...]
    base_url: str
    headers: dict[str, str]
    clock: ModelClock  # time scale of the embedded emulator; 1 for a real endpoint
    emulated: bool
    out: Path
    model: str | None = None
    metrics_urls: tuple[str, ...] = ()
    workers: int = 1
    distributed: DistributedCfg | None = None  # --ray: the arms are sent from a Ray cluster's workers
    engine: Started | None = None  # an engine kvbench started ([engine])
    context: Context | None = None  # the model's context where known better than the scenario says


@dataclass
class Session:
    """The endpoint as found once for all arms."""

    client: StreamingClient
    model: str
    server: str  # "vllm", "llama.cpp", ... or "openai" (no /tokenize)
    counting: str  # how prompt lengths are counted, for run.json
    builder: PromptBuilder


@dataclass
class Outcome:
    folder: Path
    status: str
    failed: int
    req_per_s: float | None
    aborted: bool
    traffic: bool
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ends_run(self) -> bool:
        return self.status == "interrupted" or self.aborted


# run.json's prompt_counting where the server has no /tokenize and no tokenizer is given
ESTIMATED = "estimate calibrated on usage.prompt_tokens (no /tokenize)"


@dataclass
class RunState:
    stop: aio.Stopping = field(default_factory=aio.Stopping)
    stamp: str = ""
    plans: dict[str, Plan] = field(default_factory=dict)  # by load: settled once, shared by the arms
    launcher: Launcher | None = None  # --workers or --ray: where each arm's workers run
    writer: RunWriter | None = None  # the arm's whose run.json says `running` now

    def prior(self) -> Plan | None:
        """A plan already made (at another load), whose prompts a new one reuses."""
        return next(iter(self.plans.values()), None)


async def open_session(t: Target, client: StreamingClient) -> Session:
    sc = t.scenario
    models = await endpoint.list_models(client.session, t.base_url, t.headers)
    model = t.model or sc.endpoint.model or models[0]
    if model not in models:
        raise EndpointError(
            f"model {model!r} is not served by {endpoint.redact(t.base_url)}; it serves: {', '.join(models)}"
        )
    found = await endpoint.server_counter(client.session, t.base_url, model, sc.endpoint.api, t.headers)
    server = found[1] if found else "openai"
    if sc.endpoint.tokenizer is not None:  # the user's choice, over the server's /tokenize
        counter, counting = hf_tokenizer.counter(sc.endpoint.tokenizer, sc.endpoint.api)
    elif found:
        counter, counting = found[0], f"server /tokenize ({server} format)"
    else:
        counting = ESTIMATED
        counter = await endpoint.usage_counter(client.session, t.base_url, model, sc.endpoint.api, t.headers)
    cache = None
    if (folder := prompts.cache_folder()) is not None and sc.prompts.source == "synthetic":
        cache = prompts.PromptCache(folder, await prompts.fingerprint(counter, server, model, sc.endpoint.api))
    run_salt = random.SystemRandom().randrange(10**prompts.LEAD_DIGITS)
    builder = PromptBuilder(counter, sc.prompts.seed, sc.prompts.tolerance, run_salt, cache)
    return Session(client, model, server, counting, builder)


async def run_arms(t: Target, console: Console) -> tuple[int, list[Path]]:
    """Every arm in turn; returns the exit code and the result folders written."""
    state = RunState(stamp=utc_stamp(datetime.now(UTC)))
    _on_sigint(state, console)
    progress = RunProgress(console)
    outcomes: list[Outcome] = []
    ep = t.scenario.endpoint
    async with contextlib.AsyncExitStack() as stack:
        pool = t.scenario.workload.most_connections()
        client = await stack.enter_async_context(client_for(pool, ep, t.headers, t.emulated))
        session = await open_session(t, client)
        if session.counting == ESTIMATED:
            tolerance = t.scenario.prompts.tolerance
            console.print(
                f"note: prompt lengths are estimates ({ESTIMATED}; no [endpoint] tokenizer): a prompt "
                f"within prompts.tolerance ({tolerance:.1%}) of its target is not warned of; requests.jsonl's "
                "prompt_tokens is the server's own count",
                markup=False,
            )
        say = functools.partial(console.print, markup=False)
        try:
            state.launcher = await launcher_for(stack, t.distributed, t.workers, t.base_url, state.stop, say)
        except Interrupted as e:
            console.print(str(e), markup=False)
            return ExitCode.INTERRUPTED, []
        kind = driver(t.scenario.workload.kind)
        for arm in t.arms:
            try:
                await kind.run_arm(t.scenario, Measure(t, session, arm, state, progress, outcomes), console, arm.name)
            except asyncio.CancelledError:
                return ExitCode.INTERRUPTED, [o.folder for o in outcomes]
            if outcomes and outcomes[-1].ends_run:
                break
    _traffic_drop(outcomes, console)
    done = tuple(o.folder for o in outcomes)
    kind.after_arms(ArmsDone(t.scenario, done, t.out / t.scenario.name, state.stamp, console))
    folders = [o.folder for o in outcomes]
    if any(o.status == "interrupted" for o in outcomes):
        return ExitCode.INTERRUPTED, folders
    failed = sum(o.failed for o in outcomes)
    if failed or any(o.aborted for o in outcomes):
        console.print(f"[red]{failed} request(s) failed[/]; see the error field in requests.jsonl")
        return ExitCode.REQUESTS_FAILED, folders
    return ExitCode.OK, folders


def _on_sigint(state: RunState, console: Console) -> None:
    """First Ctrl-C (or SIGTERM, as `timeout`, CI cancellation and `docker stop` send): no new
    requests, in-flight ones get aio.GRACE_S. Second: stop at once. What is in flight is cut
    short and recorded so (its workers too are told to), and whatever the run is doing after
    aio.HURRY_S more is cancelled; later presses change nothing (the stop is under way, and is
    not itself cut short). Either way the results are kept and marked interrupted: run.json says
    so at once, before the grace period (`docker stop` sends SIGKILL 10 s after SIGTERM), and
    again with the figures once the arm has drained."""
    main_task = asyncio.current_task()
    presses = 0

    def handler() -> None:
        nonlocal presses
        presses += 1
        state.stop.set()
        if state.writer is not None:
            with contextlib.suppress(FilesError):
                state.writer.finish("interrupted", ended=_now(), keep_open=True)
        if presses == 1:
            console.print(
                "[yellow]Interrupted:[/] no new requests; in-flight ones get a few seconds "
                "(Ctrl-C again to stop at once)."
            )
        elif presses == 2 and main_task:
            state.stop.hurry()
            # once: a cancellation of the stop itself (a third press while the client closes,
            # the arm's end is written) escaped as a traceback with exit 1
            asyncio.get_running_loop().call_later(aio.HURRY_S, _cancel, main_task)

    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, handler)


def _cancel(task: asyncio.Task[Any]) -> None:
    if not task.done():
        task.cancel()


@dataclass(frozen=True)
class Measure:
    """Measures an arm at one load into a folder of its own, for the workload kind that decides
    the arm's loads (workloads/kind.py `run_arm`)."""

    t: Target
    session: Session
    arm: Arm
    state: RunState
    progress: RunProgress
    outcomes: list[Outcome]

    async def __call__(self, load: Load | None, at: str | None) -> Outcome:
        outcome = await ArmLifecycle(self.t, self.session, self.arm, self.state, self.progress, load, at).run()
        self.outcomes.append(outcome)
        return outcome


def _traffic_drop(outcomes: list[Outcome], console: Console) -> None:
    by_traffic = {o.traffic: o.req_per_s for o in outcomes if o.req_per_s}
    if len(by_traffic) < 2:
        return
    d = stats.drop(by_traffic[False], by_traffic[True])
    pub = reference.traffic_drop()
    console.print(
        f"Competing traffic: {by_traffic[False]:.3g} -> {by_traffic[True]:.3g} req/s, a drop of "
        f"{d['drop_pct']:.1f} % (published: {pub['before']:g} -> {pub['after']:g} req/s, "
        f"{pub['drop_pct']:.1f} %; the paper says {pub['claimed_pct']} %)"
    )


class ArmLifecycle:
    """One arm, from its folder to its summary."""

    def __init__(
        self,
        t: Target,
        session: Session,
        arm: Arm,
        state: RunState,
        progress: RunProgress,
        load: Load | None = None,
        at: str | None = None,
    ) -> None:
        self.t, self.session, self.arm, self.state, self.progress = t, session, arm, state, progress
        self.load = load  # an open loop's: this folder's load
        self.at = at  # of several loads: the folder's suffix, which its summary says too
        self.spec = kinds.get(t.scenario.workload.kind)
        self.driver = driver(self.spec.name)
        self.figures = figures_of(self.spec.name)
        self.base = arm.endpoint.rstrip("/") if arm.endpoint else t.base_url
        self.traffic_on = t.scenario.traffic is not None and arm.traffic
        self.health: dict[str, Any] | None = None
        # Set as the arm goes; a Ctrl-C at any point finds them defined.
        self.scraper: Scraper | None = None
        self.before: metrics.Snapshot | None = None  # server counters just before the clock starts
        self.traffic_load: TrafficDriver | None = None

    async def run(self) -> Outcome:
        t, arm, session = self.t, self.arm, self.session
        if arm.endpoint and session.model not in await endpoint.list_models(
            session.client.session, self.base, t.headers
        ):
            raise EndpointError(f"arm {arm.name}: {endpoint.redact(self.base)} does not serve {session.model!r}")
        hook = None
        if arm.before:
            hook = await endpoint.run_hook(arm.before, arm.name, self.base, session.client.session, t.headers)
        elif t.engine is not None and t.engine.reset is not None:
            own = " and setting it up as the arm's `engine` says" if arm.engine is not None else ""
            self.progress.console.print(f"arm {arm.name}: emptying the engine's KV cache{own}", markup=False)
            hook = await asyncio.to_thread(t.engine.reset, arm.engine)
        suffix = f"-{self.at}" if self.at else ""
        folder = _new_folder(t.out / t.scenario.name, f"{self.state.stamp}-{arm.name}{suffix}")
        writer = RunWriter(folder, self._meta(hook))
        sender = self._sender(writer)
        interrupted = False
        self.state.writer = writer
        try:
            try:
                await self._measure(sender, writer)
            except asyncio.CancelledError:
                interrupted = True
            return await self._finish(sender, writer, interrupted)
        except BaseException as e:
            self.progress.stop()
            writer.meta.update(sender.info)
            # run.json says so if it can still be written (a full disk may refuse that too)
            status = "interrupted" if isinstance(e, asyncio.CancelledError | KeyboardInterrupt) else "failed"
            error = self.session.client.redact(f"{type(e).__name__}: {e}")
            with contextlib.suppress(FilesError):
                writer.finish(status, ended=_now(), error=error, warnings=sender.warnings)
            raise
        finally:
            self.state.writer = None

    def _sender(self, writer: RunWriter) -> Sender:
        t, arm, session = self.t, self.arm, self.session
        spec = ArmSpec(
            t.scenario,
            arm,
            self.base,
            session.model,
            self.state.stamp,
            session.server,
            t.clock,
            self.load,
            t.context,
            t.engine.body_fields if t.engine else None,
        )
        sender = Sender(
            spec=spec,
            client=session.client,
            builder=session.builder,
            progress=self.progress,
            stop=self.state.stop,
            rng=random.Random(f"{self.state.stamp}/{arm.name}/{random.SystemRandom().random()}"),
        )
        sender.subscribers += [writer.add, lambda r: self.progress.advance(r.ok, r.ttft_s)]
        return sender

    async def _measure(self, sender: Sender, writer: RunWriter) -> None:
        """Plan, side jobs (traffic, scraper, monitor), then the workload, on the arm's clock."""
        sc, t = self.t.scenario, self.t
        self.progress.label = self.arm.name
        self.scraper = self._scraper()
        if self.scraper is not None and not self.spec.shares_schedule:
            sender.scraper = self.scraper  # one request at a time: counters around each
        sender.block, source = await self._block_size()
        writer.meta["warm_rule"] = checks.warm_rule(sender.block, source)
        key = self.load.label if self.load is not None else ""
        if key not in self.state.plans:  # (sizing prompts can take a while: a stop ends it at once)
            planning = self.driver.plan(sender, self.state.prior())
            self.state.plans[key] = await aio.unless_stopped(planning, self.state.stop)
        plan = self.state.plans[key]
        writer.meta.update(plan.info)
        if self.traffic_on and sc.traffic is not None:
            self.traffic_load = make_driver(
                sc.traffic, writer.folder, f"{self.state.stamp}-{self.arm.name}", self.base, t.clock
            )
            self.progress.note(f"starting competing traffic ({sc.traffic.tool}, {sc.traffic.target})")
            await self.traffic_load.start()
            await asyncio.sleep(t.clock.wall_s(sc.traffic.start_before_s))
        self.before = await self.scraper.snapshot() if self.scraper is not None and sender.scraper is None else None
        if t.emulated:
            await self._emulator_lateness("POST")  # a new count for this arm
        launcher = self.state.launcher
        pool = launcher.pool(sender, self.spec.name, plan, writer, t.emulated) if launcher is not None else None
        if pool is not None:
            await pool.ready()  # processes started before the clock: an open loop's time 0 is theirs too
        aio.freeze_heap()
        clock = sender.spec.clock.start()
        sender.spec = replace(sender.spec, clock=clock)
        writer.meta["t0_monotonic_ns"] = clock.t0_ns
        monitor = LoopMonitor(active=lambda: sender.in_flight > 0)
        monitor.start()
        sampler = None
        if self.scraper is not None and sc.metrics.interval_s > 0:
            sampler = asyncio.create_task(self.scraper.sample_every(sc.metrics.interval_s, clock))
        try:
            if pool is not None:
                job: Coroutine[Any, Any, Any] = pool.run(clock)
            else:
                self.progress.start(self.arm.name, plan.total)
                job = self.driver.drive(sender, plan)
            # a pool stops its workers itself and bounds its own wait for their last records
            grace_s, cut = (pool.grace_s, None) if pool is not None else (aio.GRACE_S, self.state.stop.now)
            result = (await aio.until_done_or_stopped(job, self.state.stop, grace_s, cut)).result()
            self.health = result if isinstance(result, dict) else None
        finally:
            self.progress.stop()
            own = monitor.stop()
            own.update(self.session.client.health())
            self.health = self.health or own
            if sampler is not None:
                sampler.cancel()
            if self.traffic_load is not None:
                writer.meta["traffic"] = _finish_traffic(await self.traffic_load.stop(clock), writer.folder, sender)

    async def _emulator_lateness(self, method: str) -> dict[str, Any] | None:
        """The embedded emulator's own count of how late it was against its model (None if it
        could not be asked: the run's figures do not depend on it)."""
        url = endpoint.join(endpoint.root(self.base), "/kvbench/lateness")
        try:
            async with self.session.client.session.request(
                method, url, timeout=endpoint.within(self.session.client.session, 10)
            ) as r:
                got = await r.json() if r.status == 200 else None
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return got if isinstance(got, dict) else None

    async def _block_size(self) -> tuple[int | None, str]:
        """The server's KV block size for the warm check, and where it came from."""
        snap = await self.scraper.snapshot() if self.scraper is not None else None
        if snap is not None and (said := metrics.block_size(snap)) is not None:
            return said
        if self.session.server == "llama.cpp":
            return 1, "llama.cpp caches a prefix of any length"
        return None, ""

    def _scraper(self) -> Scraper | None:
        sc, t = self.t.scenario, self.t
        if not sc.metrics.enabled:
            return None
        given = t.metrics_urls or sc.metrics.urls
        urls = list(given or [endpoint.join(endpoint.root(self.base), "/metrics")])
        # with the endpoint's own metrics, those of the engine's workers kvbench started (new
        # processes each arm: the scraper is made after the arm's reset)
        workers = t.engine.metrics_urls if t.engine is not None and not given else {}
        urls += [*workers, *sc.metrics.extra_urls]
        return Scraper(self.session.client.session, urls, t.headers, workers)

    async def _finish(self, sender: Sender, writer: RunWriter, interrupted: bool) -> Outcome:
        health = self.health or {}
        writer.meta["client_health"] = health
        writer.meta.update(sender.info)
        records = read_table(writer.folder / REQUESTS, itl=False)
        reads = stats.first_token_reads(records, self.t.clock.scale)
        writer.meta["first_token_stamps"] = {**{k: reads[k] for k in ("kernel", "user")}, "kernel_clock": KERNEL_CLOCK}
        health["lateness"] = {k: reads[k] for k in ("late_ms", "shared_reads")}
        health["warning"] = selfcheck.client_warning(health, reads)
        if (w := health.get("warning")) and w not in sender.warnings:
            sender.warn(w)
        if self.t.emulated and isinstance(writer.meta.get("emulator"), dict):
            writer.meta["emulator"]["lateness"] = late = await self._emulator_lateness("GET")
            if (warning := selfcheck.emulator_warning(late)) is not None:
                sender.warn(warning)
        if self.scraper is not None:
            if sender.scraper is None:
                self.scraper.record("run", self.before, await self.scraper.snapshot(), records)
            writer.meta["server_metrics"] = _finish_metrics(self.scraper, writer.folder, sender)
        if resent := int(records.flag("retried").sum()):  # the server saw these ids twice
            health["resent"] = resent
            sender.warn(f"{resent} requests were sent a second time, the first refused at once (see `retried`)")
        slo = self.t.scenario.slo
        summary = self.figures.summary(records, slo.limits() if slo else None)
        for warning in self.figures.warnings(summary):
            sender.warn(warning)
        if "schedule_lag" in summary:
            health["schedule_lag"] = summary["schedule_lag"]
            for i, h in enumerate(health.get("per_process") or []):  # each process's or worker's own
                h["schedule_lag"] = stats.schedule_lag_of(records, h.get("worker", i))
            if (warning := selfcheck.schedule_warning(summary["schedule_lag"])) is not None:
                sender.warn(warning)
        if isinstance(trace := writer.meta.get("trace"), dict) and trace.get("possible_cached_share"):
            summary["possible_cached_share"] = trace["possible_cached_share"]
        title = f"{self.arm.name} at {self.at}" if self.at else self.arm.name
        unit = " (model time)" if self.t.clock.modelled else ""
        self.figures.show(self.progress.console, f"{self.t.scenario.name} / {title}", summary, unit)
        interrupted = interrupted or (self.state.stop.is_set() and not sender.aborted)
        status = "interrupted" if interrupted else "failed" if sender.aborted else "completed"
        extra: dict[str, Any] = {"ended": _now(), "summary": summary, "warnings": sender.warnings}
        extra["cold_cached_allowance"] = sender.cold_allowance
        if sender.aborted:
            extra["error"] = sender.aborted
            self.progress.console.print(f"[red]Run stopped:[/] {escape(sender.aborted)}")
        writer.finish(status, **extra)
        self.progress.console.print(f"Results: {writer.folder} ({status}, {len(records)} requests)", markup=False)
        rate = self.figures.traffic_req_per_s(summary)
        aborted = sender.aborted is not None
        return Outcome(writer.folder, status, summary["failed"], rate, aborted, self.traffic_on, summary)

    def _meta(self, hook: str | None) -> dict[str, Any]:
        t, sc, arm = self.t, self.t.scenario, self.arm
        scale = t.clock.scale if t.emulated else None
        return {
            "run_id": self.state.stamp,
            "scenario_name": sc.name,
            "scenario_file": sc.path,
            "scenario_hash": sc.digest(),
            "scenario": sc.to_dict(),
            "arm": arm.name,
            "arm_cache": arm.cache,
            "load": self.load.meta() if self.load is not None else None,
            "before_hook": hook,
            "endpoint": endpoint.redact(self.base),
            "model": self.session.model,
            "emulated": t.emulated,
            "emulator": {"profile": sc.emulator.profile, "time_scale": scale} if scale else None,
            "engine": t.engine.info if t.engine else None,
            "time_scale": t.clock.scale,
            "times": t.clock.times_label(),
            "clock": "time.perf_counter_ns (monotonic)",
            "event_loop": aio.loop_name(),
            "request_header_names": sorted(k for k in t.headers if k.lower() != "authorization"),
            "api_key_sent": "Authorization" in t.headers,
            "prompt_counting": self.session.counting,
            "versions": versions(),
            "client": machine(),
            "started": _now(),
        }


def _now() -> str:
    return iso(datetime.now(UTC))


def _finish_metrics(scraper: Scraper, folder: Path, sender: Sender) -> dict[str, Any]:
    doc, warnings = scraper.write(folder)
    for w in warnings:
        sender.warn(w)
    if doc["unreachable"] and not any(p["raw_deltas"] for p in doc["phases"].values()):
        where = ", ".join(f"{u} ({why})" for u, why in doc["unreachable"].items())
        sender.warn(
            f"no server metrics from {where}: server-side cache verification skipped "
            "(vLLM serves /metrics by default; llama.cpp needs --metrics; or give --metrics-url)"
        )
    if doc["verdict"]:
        sender.progress.console.print(f"Server counters: {doc['verdict']}", markup=False)
    return {
        "verdict": doc["verdict"],
        "urls": doc["urls"],
        "hit_ratio_by_phase": {k: v["server_hit_ratio"] for k, v in doc["phases"].items()},
    }


def _finish_traffic(res: TrafficResult, folder: Path, sender: Sender) -> dict[str, Any]:
    if (problem := res.check()) is not None:
        res.warnings.append(problem)
        sender.warn(problem)
    for w in res.warnings:
        if w != problem:
            sender.warn(f"traffic: {w}")
    res.write(folder)
    achieved = res.achieved_bytes_per_s()
    if achieved is not None:
        sender.progress.console.print(
            f"Competing traffic ({res.tool}): "
            f"{human_bandwidth(achieved)} achieved"
            + (f" of {human_bandwidth(res.target_bytes_per_s)} target" if res.target_bytes_per_s else ""),
            markup=False,
        )
    return {
        "tool": res.tool,
        "emulated": res.emulated,
        "target_bytes_per_s": res.target_bytes_per_s,
        "achieved_bytes_per_s": achieved,
        "warnings": res.warnings,
    }


def _new_folder(parent: Path, name: str) -> Path:
    folder, n = parent / name, 1
    while folder.exists():
        n += 1
        folder = parent / f"{name}.{n}"
    return folder
