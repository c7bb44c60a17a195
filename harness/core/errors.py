"""The one table of exit codes, and the errors that carry them.

A user mistake raises one of these; the CLI prints its message and exits with its code,
never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path
from typing import BinaryIO


class ExitCode(IntEnum):
    OK = 0
    GATE_FAILED = 1  # reserved for `kvbench gate`
    INVALID_INPUT = 2  # scenario file, CLI usage
    ENDPOINT = 3  # endpoint / infrastructure failure before any result, or a failed arm hook
    MISSING_DATA = 3  # kvbench gate: a metric a rule needs is absent
    REQUESTS_FAILED = 4  # the run finished (or was aborted) with failed requests
    FILES = 5  # a file could not be written or read: disk full, file size limit, permissions
    INTERRUPTED = 130  # Ctrl-C; partial results kept


EXIT_CODE_TABLE = """\
Exit codes:
  0    ok
  1    a gate rule failed (kvbench gate)
  2    invalid input: scenario file, CLI usage, bad gate rule, incompatible baseline
  3    endpoint failure before any result (unreachable, wrong model, HTTP 401, failed hook);
       kvbench gate: data a rule needs is missing, or result lines had to be left out
  4    the run finished but some requests failed (the count is printed), or an arm was stopped
       after 10 requests in a row could not connect or timed out
  5    a file could not be written or read (disk full, file size limit, permissions); a run
       marks itself "failed" where run.json can still be written
  130  interrupted (Ctrl-C or SIGTERM); partial results are kept and marked "interrupted"
"""


class KvbenchError(Exception):
    exit_code: ExitCode = ExitCode.INVALID_INPUT


class InputError(KvbenchError):
    """Bad scenario file, bad flag, bad prompt file."""

    exit_code = ExitCode.INVALID_INPUT


class FilesError(KvbenchError):
    """kvbench could not write (or read) a file of its own: results, a report, a gate output."""

    exit_code = ExitCode.FILES


_STOPS = (signal.SIGINT, signal.SIGTERM)  # the signals that stop a command (exit 130)


def signals_interrupt() -> None:
    """SIGTERM (`timeout`, CI cancellation, `docker stop`) raises KeyboardInterrupt, as Ctrl-C
    does: a command then ends with exit 130 and removes its outputs' temporary files (`replaced`),
    instead of dying with 143 mid-write. Ctrl-C gets Python's own handler back (an event loop that
    ran may have left another). Only the main thread can set handlers (a test may run a command
    in another)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held while the block runs, then raised as KeyboardInterrupt when it ends
    (unless it failed otherwise): for writes that must be whole or not begun. An interrupt raised
    between two bytecodes of gzip's write left a member whose CRC did not match its data, and the
    whole file unreadable. Only the main thread sets handlers; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = {sig: signal.signal(sig, lambda signum, _frame: held.append(signum)) for sig in _STOPS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if held:
        raise KeyboardInterrupt


def exit_at_once(_signum: int, _frame: object) -> None:
    """A signal handler for when everything is written: end the process now with exit 130 (what
    the streams hold flushed first), not through a KeyboardInterrupt that Python's shutdown or a
    library's teardown would turn into a traceback or a death by SIGINT."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # interrupted mid-write: what is there is there
            stream.flush()
    os._exit(ExitCode.INTERRUPTED)


def signals_ignored() -> None:
    """From here to the process's end, SIGINT and SIGTERM are ignored: the command is over, its
    outputs written and its exit code decided. Python's shutdown puts the default action back in
    place of any handler of its own (a Ctrl-C there killed kvbench by SIGINT, exit -2), but not
    in place of SIG_IGN."""
    if threading.current_thread() is threading.main_thread():
        for sig in _STOPS:
            signal.signal(sig, signal.SIG_IGN)


def write_file(path: Path, text: str) -> Path:
    """Write a whole output file at once: to a temporary file beside it, then renamed over it, so
    that a reader never finds it half written. A failure (full disk, size limit) is a FilesError
    naming the file, and leaves neither a partial file nor the temporary one behind."""
    with replaced(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


# Permissions of a file kvbench writes: what open() would give it under the process's umask
# (read once, at import, while nothing else runs: the umask can only be read by setting it)
_UMASK = os.umask(0)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK


@contextlib.contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """A fresh temporary file beside `path` (a name no one can guess, created exclusively: a link
    planted there is never followed) to write into; renamed over `path` when the block ends, or
    removed if it fails. An OSError is a FilesError naming `path`."""
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, FILE_MODE)
        os.close(fd)
    except OSError as e:
        raise files_error(e, str(path)) from None
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise files_error(e, str(path)) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def files_error(e: OSError, what: str) -> FilesError:
    where = e.filename or what
    return FilesError(f"{where}: {e.strerror or e}" + (" (no space left)" if e.errno == 28 else ""))


class EndpointError(KvbenchError):
    """The endpoint cannot be used: unreachable, unauthorised, unknown model, failed hook."""

    exit_code = ExitCode.ENDPOINT


# The largest input text file kvbench reads whole (scenario, gate rules, baseline): far above any
# real one, and a bound on what a device or a runaway file can cost (`validate /dev/zero`).
MAX_INPUT_BYTES = 16 << 20
READ_CHUNK = 1 << 20


def open_regular(path: Path, what: str) -> BinaryIO:
    """`path` opened for reading if it is a regular file (after symlinks); a device, a FIFO or a
    folder is refused by name instead of read for ever or waited on (`/dev/zero`, a pipe)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, to be refused
    except FileNotFoundError:
        raise InputError(f"{path}: no such {what}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file: not a {what}")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_input(path: Path, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A whole input text file, at most `limit` bytes; InputError naming it otherwise."""
    with open_regular(path, what) as f:
        try:
            # a chunk at a time: f.read(limit + 1) would take a buffer of `limit` bytes for a file of a few KB
            chunks, total = [], 0
            while total <= limit and (chunk := f.read(min(READ_CHUNK, limit + 1 - total))):
                chunks.append(chunk)
                total += len(chunk)
            data = b"".join(chunks)
        except OSError as e:
            raise InputError(f"{path}: cannot read the {what}: {e.strerror or e}") from None
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit >> 20} MiB: not a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: the {what} is not UTF-8 text: {e}") from None


def lines(f: BinaryIO, limit: int) -> Iterator[tuple[int, int, bytes | None]]:
    """(line number, byte offset, line) of a file read a line at a time, each at most `limit`
    bytes: a longer one is skipped to its end, a chunk at a time, and given as None (bounded
    memory, whatever the file holds)."""
    n = offset = 0
    while line := f.readline(limit + 1):
        n += 1
        if len(line) <= limit:
            yield n, offset, line
            offset += len(line)
            continue
        at, size = offset, len(line)
        while line and not line.endswith(b"\n"):
            line = f.readline(limit)
            size += len(line)
        offset += size
        yield n, at, None


REDACTED = "[redacted]"
SECRET_MIN_CHARS = 4  # shorter header values ("1", "on") are no secret, and would mangle any text


class Redactor:
    """Takes the secrets kvbench was given (the API key, `--header` values) out of text that came
    from a server before it is written or shown: a server may echo a request's headers back in an
    error body."""

    def __init__(self, headers: dict[str, str] | None = None) -> None:
        found = set()
        for value in (headers or {}).values():
            found.add(value.strip())
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() in ("bearer", "basic", "token") and token:
                found.add(token.strip())
        self.secrets = tuple(sorted((v for v in found if len(v) >= SECRET_MIN_CHARS), key=len, reverse=True))

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text
