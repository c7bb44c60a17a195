"""`kvbench run`: resolve the endpoint (or start the embedded emulator), check every option, then
hand the arms to the runner; `--report` renders the report afterwards."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rich.console import Console

from harness.commands.context import known_context
from harness.config import kinds, scenario
from harness.config.engines import EngineCfg
from harness.core import aio
from harness.core.clock import ModelClock, check_scale
from harness.core.errors import InputError, KvbenchError, Redactor, signals_interrupt
from harness.gate.rules import check_rules
from harness.server import endpoint

if TYPE_CHECKING:
    from harness.engines import Started


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
    workers: int | None = None  # --workers: processes on this host, or with Ray the worker actors
    ray: str | None = None  # --ray: the Ray cluster's address ("auto": the one this host belongs to)
    report: bool = False
    timeouts: tuple[tuple[str, float], ...] = ()  # --timeout-*: (Timeouts field, seconds)


# Headers kvbench sets itself, per request: a user's value would corrupt the framing or the route.
OWN_HEADERS = ("content-length", "transfer-encoding", "host", "connection", "content-type")


def parse_headers(raw: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in raw:
        name, sep, value = h.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise InputError(f"--header: expected 'Name: value', got {h!r}")
        if any(c in h for c in "\r\n\0"):
            raise InputError(f"--header: {name.strip()!r}: line breaks and NUL are not allowed in a header")
        if name.strip().lower() in OWN_HEADERS:
            raise InputError(f"--header: kvbench sets {name.strip()} itself")
        out[name.strip()] = value.strip()
    return out


def _api_key(env: str | None) -> str | None:
    if env is not None:
        if not os.environ.get(env):
            raise InputError(f"--api-key-env: environment variable {env} is not set or empty")
        return os.environ[env]
    return os.environ.get("OPENAI_API_KEY") or None


def _check(opts: RunOptions, sc: scenario.Scenario, emulated: bool, ray: scenario.DistributedCfg | None) -> None:
    if not emulated and opts.time_scale is not None:
        raise InputError("--time-scale: applies only to the embedded emulator (no --endpoint given, no [engine])")
    if opts.time_scale is not None:
        check_scale(opts.time_scale, "--time-scale")
    workers = opts.workers or (ray.workers if ray else None) or 1
    flag = "--ray" if ray else "--workers"
    if opts.workers is not None and opts.workers < 1:
        raise InputError(f"--workers: expected a number of processes >= 1, got {opts.workers}")
    if (workers > 1 or ray) and any(a.warm_from != "active" for a in sc.arms):
        raise InputError(f"{flag}: arms with warm_from keep their engine slots and files in one process")
    if (workers > 1 or ray) and not kinds.get(sc.workload.kind).shares_schedule:
        raise InputError(f"{flag}: a {sc.workload.kind} workload sends one request at a time; it cannot be shared")
    cap = sc.workload.concurrency_cap()
    if cap is not None and workers > cap:
        raise InputError(
            f"{flag}: {workers} processes cannot share max_concurrency = {cap} ({sc.path}): give at most as many"
        )
    for m in opts.metrics_urls:
        endpoint.check_url(m, "--metrics-url")
    sc.workload.check_files(sc.path)


def distributed(opts: RunOptions, sc: scenario.Scenario) -> scenario.DistributedCfg | None:
    """Ray, if --ray or the scenario's [distributed] asks for it (--ray's address first)."""
    if opts.ray is None and sc.distributed is None:
        return None
    from harness.distributed import raypool

    raypool.require()
    cfg = sc.distributed or scenario.DistributedCfg()
    return replace(cfg, address=opts.ray or cfg.address, workers=opts.workers or cfg.workers)


def _secret_headers(opts: RunOptions) -> dict[str, str]:
    """The headers every request carries: the user's, and the API key's."""
    headers = parse_headers(opts.headers)
    if key := _api_key(opts.api_key_env):
        headers["Authorization"] = f"Bearer {key}"
    return headers


def run(opts: RunOptions, console: Console) -> tuple[int, list[Path]]:
    """Returns the exit code and the result folders written."""
    from harness.runner import Target, run_arms

    sc = _with_timeouts(scenario.load(opts.scenario), opts.timeouts)
    check_rules(sc)
    headers = _secret_headers(opts)
    arms = tuple(sc.arm(name) for name in opts.arms) if opts.arms else sc.arms
    url = opts.endpoint or os.environ.get("OPENAI_BASE_URL") or sc.endpoint.url
    engine = sc.engine if url is None else None  # --endpoint: an engine someone else started
    if sc.engine is not None and url is not None:
        console.print("[yellow]note:[/] the scenario's [engine] is not started: the endpoint given is used instead")
    emulated = url is None and engine is None
    ray = distributed(opts, sc)
    _check(opts, sc, emulated, ray)
    if url is not None:
        url = endpoint.check_url(url, "--endpoint" if opts.endpoint else "endpoint URL")
        if urlsplit(url).username is not None and any(k.lower() == "authorization" for k in headers):
            raise InputError(
                "--endpoint: the URL carries credentials (user:pass@) and an API key or Authorization header "
                "is set too: give one of them"
            )
    for arm in arms:
        if arm.endpoint:
            endpoint.check_url(arm.endpoint, f"{sc.path}: arms.{arm.name}.endpoint")
    context = known_context(sc, emulated, engine)
    scenario.check_lengths(sc, context)
    scale = (opts.time_scale or sc.emulator.time_scale) if emulated else 1.0
    cap = sc.emulator.max_time_scale
    if emulated and cap is not None and scale > cap:
        console.print(
            f"[yellow]note:[/] time scale {scale:g} is above this scenario's max_time_scale {cap:g}, beyond which "
            f"the emulator cannot keep its modelled time for this test: running at {cap:g}"
        )
        scale = cap
    # (an engine kvbench starts may need them beforehand; a trace is read for them)
    lengths = sc.workload.output_lengths(sc.endpoint.max_tokens, context) if engine is not None else frozenset()
    with (
        _engine(engine, sc.path, lengths, console) as started,
        _emulator(emulated, sc.emulator, scale, sc.path) as emu_url,
    ):
        base = emu_url or (started.base_url if started else url)
        assert base is not None
        if started is not None and started.tokenizer is not None and sc.endpoint.tokenizer is None:
            sc = replace(sc, endpoint=replace(sc.endpoint, tokenizer=started.tokenizer))
        if emu_url:
            console.print(
                f"No endpoint given: using the embedded emulator (profile {sc.emulator.profile}, "
                f"time scale {scale:g}). Results are emulated, in model time."
            )
        if started is not None and started.slot_dir is not None:  # where kvbench can drop them from the page cache
            arms = tuple(
                replace(a, slot_dir=str(started.slot_dir)) if a.warm_from == "disk" and a.slot_dir is None else a
                for a in arms
            )
        target = Target(
            scenario=sc,
            arms=arms,
            base_url=base,
            headers=headers,
            clock=ModelClock(scale),
            emulated=emulated,
            engine=started,
            out=opts.out,
            model=opts.model,
            metrics_urls=opts.metrics_urls,
            workers=opts.workers or 1,
            distributed=ray,
            context=context,
        )
        return aio.run(run_arms(target, console))


def _with_timeouts(sc: scenario.Scenario, overrides: tuple[tuple[str, float], ...]) -> scenario.Scenario:
    """The scenario with the command line's --timeout-* values in place of its own."""
    for name, seconds in overrides:
        flag = "--timeout-" + name.removesuffix("_s").replace("_", "-")
        if not math.isfinite(seconds) or seconds <= 0:
            raise InputError(f"{flag}: expected a number of seconds > 0, got {seconds}")
    if not overrides:
        return sc
    timeouts = replace(sc.endpoint.timeouts, **dict(overrides))
    return replace(sc, endpoint=replace(sc.endpoint, timeouts=timeouts))


@contextlib.contextmanager
def _emulator(emulated: bool, cfg: scenario.EmulatorCfg, scale: float, where: str) -> Iterator[str | None]:
    if not emulated:
        yield None
        return
    from harness.emulator.profiles import get_profile, with_capacities
    from harness.emulator.serve import EmbeddedEmulator

    try:
        with_capacities(get_profile(cfg.profile), cfg.capacity_blocks)
    except ValueError as e:
        raise InputError(f"{where}: emulator.capacity_blocks: {e}") from None
    with EmbeddedEmulator(cfg.profile, scale, capacity_blocks=cfg.capacity_blocks) as emu:
        yield emu.base_url


@contextlib.contextmanager
def _engine(
    cfg: EngineCfg | None, where: str, answer_lengths: Collection[int], console: Console
) -> Iterator[Started | None]:
    if cfg is None:
        yield None
        return
    from harness import engines

    what = cfg.label
    console.print(f"No endpoint given: starting {what} ([engine] of {where})", markup=False)
    with engines.start(cfg, where, answer_lengths) as started:
        console.print(f"{what}: up at {started.base_url}, stopped when the run ends", markup=False)
        yield started


def main(opts: RunOptions, console: Console) -> int:
    try:
        code, folders = run(opts, console)
    except KvbenchError as e:  # its text may quote a server that echoed the key back
        redact = Redactor(_secret_headers(opts))
        if (text := redact(str(e))) != str(e):
            raise type(e)(text) from None
        raise
    if opts.report and folders:
        signals_interrupt()  # the run's loop is gone: a signal while rendering ends the command (130)
        from harness.report.build import render
        from harness.results import load_runs

        runs = load_runs(folders)
        out = Path("reports") / f"{runs[0].meta['scenario_name']}-{runs[0].meta['run_id']}.html"
        console.print(f"Report: {render(runs, out)}", markup=False)
    return code
