"""Child processes kvbench starts and must not outlive (engines, load generators): each is
started in a session of its own (`start_new_session=True`, so that a Ctrl-C meant for kvbench
does not reach it) with `die_with_parent` as its preexec_fn, and stopped by `stop_group`, a ladder
of signals to its whole process group."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

# A server: asked to stop, then killed.
TERM_THEN_KILL = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0))


def die_with_parent() -> None:
    """In the child, before exec: on Linux the kernel sends it SIGTERM if kvbench dies without
    stopping it, even by SIGKILL (PR_SET_PDEATHSIG); elsewhere nothing."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def stop_group(proc: subprocess.Popen[Any], ladder: tuple[tuple[int, float], ...] = TERM_THEN_KILL) -> None:
    """Each signal of `ladder` to the child's process group in turn, waiting its time for the
    child to end; the group's other members get each signal too. Returns once the child ended."""
    for sig, wait_s in ladder:
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
