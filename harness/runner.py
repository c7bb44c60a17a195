"""`kvbench run`: resolve the endpoint (or start the embedded emulator), then run each arm of a
scenario into its own result folder, keeping everything on Ctrl-C or failure."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from harness import aio, drivers, endpoint, prompts, scenario, stats
from harness.client import StreamingClient
from harness.drivers import ArmRun
from harness.emulator.serve import EmbeddedEmulator
from harness.errors import EndpointError, ExitCode, InputError
from harness.progress import RunProgress
from harness.prompts import Prompt, PromptBuilder
from harness.results import SUMMARY_FIELDS, RunWriter, iso, machine, read_requests, utc_stamp, versions
from harness.scrape import Scraper
from harness.selfcheck import LoopMonitor
from harness.traffic import make_driver
from harness.traffic.base import TrafficResult
from harness.units import human_bandwidth
from harness.workers import run_workers

# After Ctrl-C, in-flight requests get this long (wall-clock) to finish before they are dropped.
GRACE_S = 5.0


@dataclass(frozen=True)
class RunOptions:
    scenario: Path
    endpoint: str | None = None
    model: str | None = None
    arms: tuple[str, ...] = ()
    out: Path = Path("results")
    time_scale: float | None = None
    headers: tuple[str, ...] = ()
    api_key_env: str | None = None
    metrics_urls: tuple[str, ...] = ()
    workers: int = 1


def parse_headers(raw: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in raw:
        name, sep, value = h.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise InputError(f"--header: expected 'Name: value', got {h!r}")
        out[name.strip()] = value.strip()
    return out


def _api_key(env: str | None) -> str | None:
    if env is not None:
        if not os.environ.get(env):
            raise InputError(f"--api-key-env: environment variable {env} is not set or empty")
        return os.environ[env]
    return os.environ.get("OPENAI_API_KEY") or None


def run(opts: RunOptions, console: Console) -> tuple[int, list[Path]]:
    """Returns the exit code and the result folders written."""
    sc = scenario.load(opts.scenario)
    headers = parse_headers(opts.headers)
    key = _api_key(opts.api_key_env)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    arms = tuple(sc.arm(name) for name in opts.arms) if opts.arms else sc.arms
    url = opts.endpoint or os.environ.get("OPENAI_BASE_URL") or sc.endpoint.url
    emulated = url is None
    if not emulated and opts.time_scale is not None:
        raise InputError("--time-scale: applies only to the embedded emulator (no --endpoint given)")
    if opts.time_scale is not None and opts.time_scale <= 0:
        raise InputError(f"--time-scale: expected a number > 0, got {opts.time_scale}")
    scale = (opts.time_scale or sc.emulator.time_scale) if emulated else 1.0
    if url is not None:
        url = endpoint.check_url(url, "--endpoint" if opts.endpoint else "endpoint URL")
    if opts.workers < 1:
        raise InputError(f"--workers: expected a number of processes >= 1, got {opts.workers}")
    if opts.workers > 1 and sc.workload.kind != "closed_loop":
        raise InputError("--workers: a sweep sends one request at a time; it applies to closed_loop scenarios")
    for m in opts.metrics_urls:
        endpoint.check_url(m, "--metrics-url")
    for arm in arms:
        if arm.endpoint:
            endpoint.check_url(arm.endpoint, f"{sc.path}: arms.{arm.name}.endpoint")

    with _emulator(emulated, sc.emulator.profile, scale) as emu_url:
        base = emu_url or url
        assert base is not None
        if emulated:
            console.print(
                f"No endpoint given: using the embedded emulator (profile {sc.emulator.profile}, "
                f"time scale {scale:g}). Results are emulated, in model time."
            )
        return aio.run(_run(opts, sc, arms, base, headers, scale if emulated else None, console))


@contextlib.contextmanager
def _emulator(emulated: bool, profile: str, scale: float) -> Iterator[str | None]:
    if not emulated:
        yield None
        return
    with EmbeddedEmulator(profile, scale) as emu:
        yield emu.base_url


async def _run(
    opts: RunOptions,
    sc: scenario.Scenario,
    arms: tuple[scenario.Arm, ...],
    base: str,
    headers: dict[str, str],
    emulated_scale: float | None,
    console: Console,
) -> tuple[int, list[Path]]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    interrupts = 0

    def on_sigint() -> None:
        nonlocal interrupts
        interrupts += 1
        stop.set()
        if interrupts == 1:
            console.print(
                "[yellow]Interrupted:[/] no new requests; in-flight ones get a few seconds "
                "(Ctrl-C again to stop at once)."
            )
        elif main_task:
            main_task.cancel()

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    started = datetime.now(UTC)
    stamp = utc_stamp(started)
    w = sc.workload
    concurrency = w.concurrency if w.kind == "closed_loop" else 1
    scale = emulated_scale or 1.0
    progress = RunProgress(console)
    failed_requests = 0
    interrupted = False
    aborted = False
    pool: list[Prompt] | None = None
    folders: list[Path] = []
    by_traffic: dict[bool, float] = {}  # req/s of the arms run without / with competing traffic
    async with StreamingClient(
        concurrency, sc.endpoint.timeouts, headers, send_clock=emulated_scale is not None
    ) as client:
        models = await endpoint.list_models(client.session, base, headers)
        model = opts.model or sc.endpoint.model or models[0]
        if model not in models:
            raise EndpointError(
                f"model {model!r} is not served by {endpoint.redact(base)}; it serves: {', '.join(models)}"
            )
        found = await endpoint.server_counter(client.session, base, model, sc.endpoint.api, headers)
        server = found[1] if found else "openai"
        if found:
            counter, counting = found[0], f"server /tokenize ({server} format)"
        else:
            counting = "estimate calibrated on usage.prompt_tokens (no /tokenize)"
            counter = await endpoint.usage_counter(client.session, base, model, sc.endpoint.api, headers)
        run_salt = random.SystemRandom().randrange(10**prompts.LEAD_DIGITS)
        cache = None
        if (folder_ := prompts.cache_folder()) is not None and sc.prompts.source == "synthetic":
            cache = prompts.PromptCache(folder_, await prompts.fingerprint(counter, server, model, sc.endpoint.api))
        builder = PromptBuilder(counter, sc.prompts.seed, sc.prompts.tolerance, run_salt, cache)
        for arm in arms:
            arm_base = arm.endpoint.rstrip("/") if arm.endpoint else base
            if arm.endpoint:
                served = await endpoint.list_models(client.session, arm_base, headers)
                if model not in served:
                    raise EndpointError(f"arm {arm.name}: {endpoint.redact(arm_base)} does not serve {model!r}")
            hook_done = None
            if arm.before:
                hook_done = await endpoint.run_hook(arm.before, arm.name, arm_base, client.session, headers)
            folder = _new_folder(opts.out / sc.name, f"{stamp}-{arm.name}")
            folders.append(folder)
            writer = RunWriter(
                folder, _meta(sc, arm, arm_base, model, emulated_scale, headers, counting, hook_done, stamp)
            )
            run = ArmRun(
                scenario=sc,
                arm=arm,
                client=client,
                base_url=arm_base,
                model=model,
                builder=builder,
                writer=writer,
                progress=progress,
                stop=stop,
                t0_ns=time.perf_counter_ns(),
                time_scale=scale,
                run_id=stamp,
                rng=random.Random(f"{stamp}/{arm.name}/{random.SystemRandom().random()}"),
                server=server,
            )
            scraper = None
            if sc.metrics.enabled:
                urls = list(
                    opts.metrics_urls or sc.metrics.urls or [endpoint.join(endpoint.root(arm_base), "/metrics")]
                )
                scraper = Scraper(client.session, urls + list(sc.metrics.extra_urls), headers)
                if w.kind == "sweep":
                    run.scraper = scraper
            arm_before = None
            sampler: asyncio.Task[None] | None = None
            monitor = LoopMonitor(active=functools.partial(_busy, run))
            progress.label = arm.name
            load = None
            t0_mono = time.monotonic()
            try:
                if w.kind == "closed_loop" and pool is None:
                    pool = await drivers.build_pool(run)
                if sc.traffic is not None and arm.traffic:
                    load = make_driver(sc.traffic, folder, f"{stamp}-{arm.name}", arm_base, scale)
                    progress.note(f"starting competing traffic ({sc.traffic.tool}, {sc.traffic.target})")
                    await load.start()
                    await asyncio.sleep(sc.traffic.start_before_s / scale)
                if scraper is not None and w.kind == "closed_loop":
                    arm_before = await scraper.snapshot()
                aio.freeze_heap()
                run.t0_ns, t0_mono = time.perf_counter_ns(), time.monotonic()
                writer.meta["t0_monotonic_ns"] = run.t0_ns
                monitor.start()
                if scraper is not None and sc.metrics.interval_s > 0:
                    sampler = asyncio.create_task(scraper.sample_every(sc.metrics.interval_s / scale, t0_mono, scale))
                if w.kind == "sweep":
                    job = drivers.sweep(run)
                elif opts.workers > 1:
                    job = run_workers(run, pool or [], opts.workers, folder, send_clock=emulated_scale is not None)
                else:
                    job = drivers.closed_loop(run, pool or [])
                await _until_done_or_stopped(job, stop)
            except asyncio.CancelledError:
                interrupted = True
            except BaseException as e:
                progress.stop()
                writer.finish(
                    "failed", ended=iso(datetime.now(UTC)), error=f"{type(e).__name__}: {e}", warnings=run.warnings
                )
                raise
            finally:
                progress.stop()
                own = monitor.stop()
                health = run.worker_health or own
                writer.meta["client_health"] = health
                if health["warning"]:
                    run.warn(health["warning"])
                if sampler is not None:
                    sampler.cancel()
                if load is not None:
                    writer.meta["traffic"] = _finish_traffic(await load.stop(t0_mono, scale), folder, run)
            records = read_requests(folder, SUMMARY_FIELDS)
            if scraper is not None:
                if w.kind == "closed_loop":
                    scraper.record("run", arm_before, await scraper.snapshot(), records)
                writer.meta["server_metrics"] = _finish_metrics(scraper, folder, run)
            summary = drivers.print_summary(run, records)
            interrupted = interrupted or (stop.is_set() and not run.aborted)
            status = "interrupted" if interrupted else "failed" if run.aborted else "completed"
            extra: dict[str, Any] = {"ended": iso(datetime.now(UTC)), "summary": summary, "warnings": run.warnings}
            if run.aborted:
                extra["error"] = run.aborted
                console.print(f"[red]Run stopped:[/] {run.aborted}")
            writer.finish(status, **extra)
            console.print(f"Results: {folder} ({status}, {len(records)} requests)")
            failed_requests += summary["failed"]
            if w.kind == "closed_loop" and summary.get("req_per_s"):
                by_traffic[bool(sc.traffic is not None and arm.traffic)] = summary["req_per_s"]
            aborted = aborted or run.aborted is not None
            if interrupted or aborted:
                break
    if len(by_traffic) == 2:
        d = stats.drop(by_traffic[False], by_traffic[True])
        console.print(
            f"Competing traffic: {by_traffic[False]:.3g} -> {by_traffic[True]:.3g} req/s, a drop of "
            f"{d['drop_pct']:.1f} % (published: 4.26 -> 3.6 req/s, 15.5 %; the paper says 18 %)"
        )
    if interrupted:
        return ExitCode.INTERRUPTED, folders
    if failed_requests or aborted:
        console.print(f"[red]{failed_requests} request(s) failed[/]; see the error field in requests.jsonl")
        return ExitCode.REQUESTS_FAILED, folders
    return ExitCode.OK, folders


async def _until_done_or_stopped(job: Any, stop: asyncio.Event) -> None:
    task = asyncio.ensure_future(job)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=GRACE_S)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    task.result()


def _busy(run: ArmRun) -> bool:
    return run.in_flight > 0


def _finish_metrics(scraper: Scraper, folder: Path, run: ArmRun) -> dict[str, Any]:
    doc, warnings = scraper.write(folder)
    for w in warnings:
        run.warn(w)
    if doc["unreachable"] and not any(p["raw_deltas"] for p in doc["phases"].values()):
        where = ", ".join(f"{u} ({why})" for u, why in doc["unreachable"].items())
        run.warn(
            f"no server metrics from {where}: server-side cache verification skipped "
            "(vLLM serves /metrics by default; llama.cpp needs --metrics; or give --metrics-url)"
        )
    if doc["verdict"]:
        run.progress.console.print(f"Server counters: {doc['verdict']}")
    return {
        "verdict": doc["verdict"],
        "urls": doc["urls"],
        "hit_ratio_by_phase": {k: v["server_hit_ratio"] for k, v in doc["phases"].items()},
    }


def _finish_traffic(res: TrafficResult, folder: Path, run: ArmRun) -> dict[str, Any]:
    if (problem := res.check()) is not None:
        res.warnings.append(problem)
        run.warn(problem)
    for w in res.warnings:
        if w != problem:
            run.warn(f"traffic: {w}")
    res.write(folder)
    achieved = res.achieved_bytes_per_s()
    if achieved is not None:
        run.progress.console.print(
            f"Competing traffic ({res.tool}): "
            f"{human_bandwidth(achieved)} achieved"
            + (f" of {human_bandwidth(res.target_bytes_per_s)} target" if res.target_bytes_per_s else "")
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


def _meta(
    sc: scenario.Scenario,
    arm: scenario.Arm,
    base: str,
    model: str,
    emulated_scale: float | None,
    headers: dict[str, str],
    counting: str,
    hook: str | None,
    run_id: str,
) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "scenario_name": sc.name,
        "scenario_file": sc.path,
        "scenario_hash": sc.digest(),
        "scenario": sc.to_dict(),
        "arm": arm.name,
        "arm_cache": arm.cache,
        "before_hook": hook,
        "endpoint": endpoint.redact(base),
        "model": model,
        "emulated": emulated_scale is not None,
        "emulator": {"profile": sc.emulator.profile, "time_scale": emulated_scale} if emulated_scale else None,
        "time_scale": emulated_scale or 1.0,
        "times": "model time: wall-clock x time_scale" if emulated_scale and emulated_scale != 1 else "wall-clock",
        "clock": "time.perf_counter_ns (monotonic)",
        "event_loop": aio.loop_name(),
        "request_header_names": sorted(k for k in headers if k.lower() != "authorization"),
        "api_key_sent": "Authorization" in headers,
        "prompt_counting": counting,
        "versions": versions(),
        "client": machine(),
        "started": iso(datetime.now(UTC)),
    }
