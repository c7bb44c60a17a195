"""Competing storage traffic during the measured phase (`[traffic]`): its config, read strictly,
and the rules every use of its directory applies (harness/traffic/ runs it)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from harness.config.tables import Table, bandwidth, size
from harness.core.errors import InputError


@dataclass(frozen=True)
class TrafficCfg:
    """Competing storage I/O during the measured phase (see harness/traffic/)."""

    tool: Literal["fio", "builtin", "command", "emulated"]
    target: str | None = None  # as written, e.g. "200GB/s"
    target_bytes_per_s: float | None = None
    rw: Literal["read", "write", "randread", "randwrite", "rw", "randrw"] = "read"
    rwmixread: int = 50
    block_size: int = 1 << 20
    iodepth: int = 16
    jobs_per_client: int = 4
    direct: bool = True
    file_size: int = 1 << 30
    directory: str | None = None
    allow_nonempty_directory: bool = False
    clients: tuple[str, ...] = ()
    fio_port: int = 8765
    start_before_s: float = 5.0
    command: tuple[str, ...] | None = None


def parse(t: Table) -> TrafficCfg:
    tool = t.text("tool", None, ("fio", "builtin", "command", "emulated"), required=True)
    target = t.text("target")
    bps = None
    if target is not None:
        bps = bandwidth(t, "target", target)
    elif tool != "command":
        raise InputError(f'{t.file}: traffic.target: missing; expected an aggregate bandwidth such as "200GB/s"')
    clients = t.get("clients")
    if clients is not None and (not isinstance(clients, list) or not all(isinstance(c, str) and c for c in clients)):
        t.fail("clients", "expected a list of host names running `fio --server`", clients)
    command = t.get("command")
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command)
    ):
        t.fail("command", "expected a non-empty list of strings (argv; no shell)", command)
    cfg = TrafficCfg(
        tool=tool,
        target=target,
        target_bytes_per_s=bps,
        rw=t.text("rw", TrafficCfg.rw, ("read", "write", "randread", "randwrite", "rw", "randrw")),
        rwmixread=t.integer("rwmixread", TrafficCfg.rwmixread, minimum=0, what="a percentage of reads"),
        block_size=size(t, "block_size", TrafficCfg.block_size),
        iodepth=t.integer("iodepth", TrafficCfg.iodepth, minimum=1),
        jobs_per_client=t.integer("jobs_per_client", TrafficCfg.jobs_per_client, minimum=1),
        direct=t.flag("direct", TrafficCfg.direct),
        file_size=size(t, "file_size", TrafficCfg.file_size),
        directory=t.text("directory"),
        allow_nonempty_directory=t.flag("allow_nonempty_directory", TrafficCfg.allow_nonempty_directory),
        clients=tuple(clients or ()),
        fio_port=t.integer("fio_port", TrafficCfg.fio_port, minimum=1),
        start_before_s=t.number("start_before_s", TrafficCfg.start_before_s, minimum=0.0),
        command=tuple(command) if command else None,
    )
    t.done()
    if cfg.rwmixread > 100:
        t.fail("rwmixread", "expected a percentage of reads from 0 to 100", cfg.rwmixread)
    if cfg.tool in ("fio", "builtin") and not cfg.directory:
        raise InputError(
            f"{t.file}: traffic.directory: missing; expected a directory on the storage under test "
            f'(tool = "{cfg.tool}")'
        )
    if cfg.tool == "command" and not cfg.command:
        raise InputError(f'{t.file}: traffic.command: missing; expected ["argv", ...] (tool = "command")')
    if cfg.directory is not None:
        check_traffic_directory(cfg.directory, f"{t.file}: traffic.directory", remote=bool(cfg.clients))
    if cfg.clients and cfg.tool != "fio":
        t.fail("clients", 'expected no clients: only tool = "fio" spans hosts (fio --client)', list(cfg.clients))
    return cfg


# Competing traffic never writes under these (nor at "/"): they are the system, not storage.
SYSTEM_PATHS = tuple(map(PurePosixPath, ("/dev", "/proc", "/sys", "/boot", "/etc", "/bin", "/sbin", "/usr", "/lib")))
# The characters a traffic directory may hold, and no others: it goes into fio's job file, where a
# line break starts a new option, ";" and "#" start a comment (fio would cut the path there and
# write into the folder before it), ":" separates several directories and "$" expands variables.
_JOB_FILE_SAFE = re.compile(r"[A-Za-z0-9/._+@%=-]+")


def check_traffic_directory(directory: str, where: str, remote: bool = False) -> PurePosixPath:
    """The rules every use of traffic.directory applies (validate, run, fio's client hosts):
    text that is safe in a job file, absolute where it is used on other hosts, not a system path.
    Returns the path, normalised (a local run resolves links too, in traffic/base.py)."""
    if not _JOB_FILE_SAFE.fullmatch(directory):
        raise InputError(
            f"{where}: refusing {directory!r}: expected letters, digits and / . _ + @ % = - only "
            "(it goes into fio's job file, where ; and # start a comment)"
        )
    if directory.startswith("//"):  # POSIX leaves a leading "//" to the system: not normalised away
        raise InputError(f"{where}: refusing {directory!r}: a path starting with //")
    path = PurePosixPath(directory)
    if remote and not path.is_absolute():
        raise InputError(f"{where}: {directory!r}: expected an absolute path (it is used on the fio client hosts)")
    if path.is_absolute():
        path = PurePosixPath(os.path.normpath(path))
        if path == PurePosixPath("/") or any(path == f or f in path.parents for f in SYSTEM_PATHS):
            raise InputError(f"{where}: refusing {directory!r}: a system path, not a storage mount")
    return path
