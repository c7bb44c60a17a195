"""The one table of exit codes, and the errors that carry them.

A user mistake raises one of these; the CLI prints its message and exits with its code,
never a traceback.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    GATE_FAILED = 1  # reserved for `kvbench gate`
    INVALID_INPUT = 2  # scenario file, CLI usage
    ENDPOINT = 3  # endpoint / infrastructure failure before any result, or a failed arm hook
    MISSING_DATA = 3  # kvbench gate: a metric a rule needs is absent
    REQUESTS_FAILED = 4  # the run finished (or was aborted) with failed requests
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
  130  interrupted (Ctrl-C or SIGTERM); partial results are kept and marked "interrupted"
"""


class KvbenchError(Exception):
    exit_code: ExitCode = ExitCode.INVALID_INPUT


class InputError(KvbenchError):
    """Bad scenario file, bad flag, bad prompt file."""

    exit_code = ExitCode.INVALID_INPUT


class EndpointError(KvbenchError):
    """The endpoint cannot be used: unreachable, unauthorised, unknown model, failed hook."""

    exit_code = ExitCode.ENDPOINT
