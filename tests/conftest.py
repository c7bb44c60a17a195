from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.emulator.serve import EmbeddedEmulator
from tests.browser import browser  # noqa: F401 (a fixture: a headless chromium for report tests)

ROOT = Path(__file__).resolve().parent.parent


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without the plugin, not called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker more than the cores. The suite spends about a third of its time waiting
    (processes and servers starting, engines answering): with two workers on 2 cores, 812 s of
    CPU in 591 s; a third worker fills that wait (the same suite 436 s, same quiet machine)."""
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that start a Ray cluster or a real engine first (they are the longest: left for
    last, one worker would run them alone while the others stand idle), the rest as collected."""
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in ("ray", "engine")))


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[EmbeddedEmulator]:
    """A real emulator on an ephemeral port, 50x faster than modelled, logging its own times."""
    with EmbeddedEmulator("redbooks-g4", 50.0, timing_log=tmp_path / "server-times.jsonl") as emu:
        yield emu


def user_env(**extra: str) -> dict[str, str]:
    """The environment a user's kvbench starts with: no endpoint or key inherited from this one."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return {**env, **extra}


def kvbench(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it."""
    full_env = user_env(**(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=ROOT,
    )


# Commands that only read files and write files: `cli` runs them in this process
FILE_COMMANDS = frozenset({"validate", "report", "export", "compare", "gate", "baseline", "trace"})


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A command that only reads and writes files (FILE_COMMANDS) through the CLI's own entry
    point, in this process (typer's CliRunner), as `kvbench` would run it from the repository:
    the same exit code, stdout and stderr, without an interpreter's start (about a second of CPU
    each, a hundred times a suite). An exception that escapes the CLI fails the test: a user
    would have seen a traceback. `env` is set while the command runs (what it reads then, not
    at import). Whatever starts a server or a run, takes a signal or needs a process of its own
    (PYTHONPATH, resource limits) goes through `kvbench`."""
    from typer.testing import CliRunner

    from harness.cli import app, with_ray_value

    assert args[0] in FILE_COMMANDS, args
    environ: dict[str, str | None] = {"OPENAI_API_KEY": None, "OPENAI_BASE_URL": None, **(env or {})}
    with contextlib.chdir(ROOT):
        r = CliRunner().invoke(app, with_ray_value(list(args)), env=environ, catch_exceptions=False)
    return subprocess.CompletedProcess(["kvbench", *args], r.exit_code, r.stdout, r.stderr)


def arm_folders(out: Path, scenario: str) -> dict[str, Path]:
    """A scenario's result folders under `out`, by arm (the part of the name after the stamp)."""
    return {p.name.split("-", 1)[1]: p for p in sorted((out / scenario).iterdir()) if p.is_dir()}


def write_scenario(path: Path, body: str) -> Path:
    path.write_text("schema_version = 1\n" + body, encoding="utf-8")
    return path


def start_kvbench(*args: str, **env: str) -> subprocess.Popen[str]:
    """`kvbench ARGS` started as a user would (environment `user_env(**env)`), not waited for."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        env=user_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def interrupt(
    args: list[str], ready: Callable[[], bool], timeout: float = 120, sig: int = signal.SIGINT
) -> tuple[int, str]:
    """Start `kvbench ARGS` as a user would, wait until `ready()`, press Ctrl-C (SIGINT; or send
    `sig`); returns its exit code and what it printed on stderr."""
    proc = start_kvbench(*args)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not ready():
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=90)
    return proc.returncode, err


def other_warnings(meta: dict[str, Any]) -> list[str]:
    """A run's warnings but those a busy machine can cause, each of which must agree with what
    run.json measured (checked here): the emulator's report of its own lateness
    (emulator.lateness), the figures it ran late in (the summary's own rows: a figure's
    `warnings`) and the client's of its own loop lag and CPU (client_health.warning)."""
    from harness.analysis.kinds import figures_of
    from harness.monitor.selfcheck import emulator_warning

    late = emulator_warning((meta.get("emulator") or {}).get("lateness"))
    rows = figures_of(meta["scenario"]["workload"]["kind"]).warnings(meta["summary"]) if meta.get("summary") else []
    busy = (meta.get("client_health") or {}).get("warning")
    return [w for w in meta["warnings"] if w not in (late, busy, *rows)]


def kind_table(runs: list[Any], title: str) -> dict[str, dict[str, Any]]:
    """The first table of the report section titled `title` that the runs' kind gives them (as
    the kind gives it, before the report formats it): each row by its first cell, its cells by
    column."""
    from harness.analysis.kinds import figures_of
    from harness.analysis.kinds.document import Table

    (section,) = [s for s in figures_of(runs[0].kind).sections(runs) if s.title == title]
    table = next(p for p in section.parts if isinstance(p, Table))
    return {str(row[0]): dict(zip(table.columns, row, strict=True)) for row in table.rows}


def result_lines(out: Path) -> int:
    """How many records the runs under `out` have written so far."""
    return sum(len(p.read_bytes().splitlines()) for p in out.glob("*/*/requests.jsonl"))


def read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process gone meanwhile
        return b""


def parent_of(pid: int) -> int:
    """A process's parent's pid; 0 once it is gone."""
    stat = read_or_empty(Path(f"/proc/{pid}/stat")).rsplit(b")", 1)
    return int(stat[1].split()[1]) if len(stat) == 2 else 0


def processes_with(marker: bytes) -> list[int]:
    """This machine's processes whose command line holds `marker` (pytest's own left out)."""
    found = []
    for p in Path("/proc").iterdir():
        cmd = read_or_empty(p / "cmdline") if p.name.isdigit() else b""
        if marker in cmd and b"pytest" not in cmd:
            found.append(int(p.name))
    return sorted(found)
