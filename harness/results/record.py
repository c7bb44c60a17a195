"""One request's record: a line of requests.jsonl (fields documented in results/README.md),
and a workload kind's own fields in it (`KindRecord`). Each field's JSON type is checked where a
line is read (`RequestRecord.from_json`, and column by column in table.py)."""

from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import dataclass, fields
from typing import Any, Self, get_args, get_type_hints

import orjson

Scalar = bool | int | float | str | None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request: one line of requests.jsonl (fields documented in results/README.md).
    Times are seconds since the request's start (`start_s`: since the arm's start), in model time."""

    id: int
    arm: str
    phase: str  # "cold" | "warm" (sweep), "run" (closed loop)
    prompt_id: str
    target_tokens: int | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    start_s: float
    ttft_s: float | None
    first_byte_s: float | None
    first_content_s: float | None
    headers_s: float | None
    e2e_s: float | None
    itl_s: list[float]
    ok: bool
    error: str | None
    error_kind: str | None  # "connect" | "http" | "timeout" | "stream" | "empty" | "protocol" | ... (results/README.md)
    http_status: int | None
    retried: bool
    # Written only where they apply (a sweep's lines have no `worker`, and so on).
    repeat: int | None = None  # sweep: 0 cold, 1.. warm
    worker: int | None = None  # closed loop: the connection that sent it
    schedule_index: int | None = None  # closed loop: its place in the drawn schedule
    process: int | None = None  # --workers N: the client process that sent it
    attempts: int | None = None  # 2 when it was sent again (see `retried`); absent in older results
    intended_s: float | None = None  # open loop: when the schedule meant it to be sent (vs start_s)
    held_s: float | None = None  # open loop: how long max_concurrency held it back before sending
    session: int | None = None  # sessions: the user's session
    turn: int | None = None  # sessions: its turn (1, 2, ...)
    idle_s: float | None = None  # sessions: since the end of the session's previous turn
    # warm_from (a tier below the engine's active KV): what the engine said of the step before
    # this warm request (tiers.py): tokens and bytes it read back, and how long that took
    warm_from: str | None = None
    restore_tokens: int | None = None
    restore_bytes: int | None = None
    restore_s: float | None = None
    # Where the first token's time came from: "kernel" (the kernel's receive stamp of the read
    # that carried it) or "user" (the time the client read it); how much later than the kernel's
    # stamp the client read it; how many later token chunks that read held (its stamp is theirs
    # when they arrived later: results/README.md)
    first_token_stamp: str | None = None
    first_token_late_s: float | None = None
    first_token_shared: int | None = None
    # the embedded emulator's: how late it sent the first token against its own model, beyond the
    # loop's timer granularity (model seconds); judged per figure (stats.EMULATOR_LATE_SHARE)
    emulator_late_s: float | None = None
    # the X-Request-Id the request was sent with (`id` is renumbered across processes; this joins
    # a record with the server's own logs)
    request_id: str | None = None
    # the workload kind's own fields, apart from those every kind shares: its KindRecord's
    # (`KindSpec.record`), read back typed by `TheKindsRecord.of(record)`
    kind_fields: dict[str, Scalar] | None = None

    @property
    def lag_s(self) -> float | None:
        """How late the request was sent against its schedule (open loop)."""
        return None if self.intended_s is None else self.start_s - self.intended_s

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT): (e2e - TTFT) / (tokens - 1)."""
        n = self.completion_tokens
        if self.e2e_s is None or self.ttft_s is None or n is None or n < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def to_json(self) -> bytes:
        d = self.as_dict()
        for f in OPTIONAL:
            if d[f] is None:
                del d[f]
        return orjson.dumps(d)

    @classmethod
    def from_json(cls, d: Any, itl: bool = True) -> RequestRecord:
        """A parsed line; unknown keys (a later kvbench's) are ignored. `itl=False` leaves out the
        per-token gaps: a million requests' gaps need not be in memory to summarise a run.
        Raises ValueError naming the first field that is not what this format says."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        values: dict[str, Any] = {f: d.get(f) for f in FIELDS}
        for f, kinds in TYPES.items():
            v = values[f]
            if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
                raise ValueError(f"{f}: expected {WHAT[kinds]}, got {json.dumps(v)[:40]}")
        gaps = d.get("itl_s") or []
        if not isinstance(gaps, list) or not all(type(g) is float or type(g) is int for g in gaps):
            raise ValueError("itl_s: expected a list of numbers")
        values["itl_s"] = gaps if itl else []
        for f in REPEATED_TEXT:  # one string object per distinct value: a million records share a few
            if values[f] is not None:
                values[f] = sys.intern(values[f])
        values["ok"], values["retried"] = bool(d.get("ok")), bool(d.get("retried"))
        values["kind_fields"] = kind_fields_of(d.get("kind_fields"))
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in FIELDS}

    def end_s(self) -> float | None:
        return None if self.e2e_s is None else self.start_s + self.e2e_s

    @property
    def context_tokens(self) -> int | None:
        """The prompt's length: the server's count, else kvbench's target."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.target_tokens


FIELDS = tuple(f.name for f in fields(RequestRecord))
OPTIONAL = (
    "repeat",
    "worker",
    "schedule_index",
    "process",
    "attempts",
    "intended_s",
    "held_s",
    "session",
    "turn",
    "idle_s",
    "warm_from",
    "restore_tokens",
    "restore_bytes",
    "restore_s",
    "first_token_stamp",
    "first_token_late_s",
    "first_token_shared",
    "emulator_late_s",
    "request_id",
    "kind_fields",
)
REPEATED_TEXT = ("arm", "phase", "prompt_id", "error_kind", "warm_from", "first_token_stamp")
OPTIONAL_NUMBERS = ("intended_s", "held_s", "idle_s", "restore_s", "first_token_late_s", "emulator_late_s")
OPTIONAL_TEXT = ("warm_from", "first_token_stamp", "request_id")
_NUMBER, _MAYBE_NUMBER, _MAYBE_INT, _MAYBE_TEXT = (
    (int, float),
    (int, float, type(None)),
    (int, type(None)),
    (str, type(None)),
)
WHAT = {
    _NUMBER: "a number",
    _MAYBE_NUMBER: "a number or null",
    _MAYBE_INT: "an integer or null",
    _MAYBE_TEXT: "a string or null",
    (int,): "an integer",
    (str,): "a string",
    (bool, type(None)): "true or false",
}
TYPES: dict[str, tuple[type, ...]] = {
    "id": (int,),
    "arm": (str,),
    "phase": (str,),
    "prompt_id": (str,),
    "start_s": _NUMBER,
    **{f: _MAYBE_INT for f in ("target_tokens", "prompt_tokens", "cached_tokens", "completion_tokens", "http_status")},
    **{f: _MAYBE_INT for f in OPTIONAL if f not in (*OPTIONAL_NUMBERS, *OPTIONAL_TEXT, "kind_fields")},
    **{f: _MAYBE_NUMBER for f in ("ttft_s", "first_byte_s", "first_content_s", "headers_s", "e2e_s")},
    **{f: _MAYBE_NUMBER for f in OPTIONAL_NUMBERS},
    **{f: _MAYBE_TEXT for f in ("error", "error_kind", *OPTIONAL_TEXT)},
    **{f: (bool, type(None)) for f in ("ok", "retried")},
}


# The longest line a reader takes for a record (longer: skipped, a chunk at a time)
RECORD_MAX_BYTES = 64 << 20
CUT_SHORT = "cut short (the run was stopped while writing it)"

# A kind's own fields: at most this many, each a JSON scalar
KIND_FIELDS_MAX = 64
_SCALARS = (bool, int, float, str, type(None))


def kind_fields_of(v: Any) -> dict[str, Scalar] | None:
    if v is None:
        return None
    if (
        not isinstance(v, dict)
        or len(v) > KIND_FIELDS_MAX
        or not all(isinstance(x, _SCALARS) and not (isinstance(x, float) and not math.isfinite(x)) for x in v.values())
    ):
        raise ValueError(
            f"kind_fields: expected an object of at most {KIND_FIELDS_MAX} numbers, texts, booleans or nulls"
        )
    return {str(k): sys.intern(x) if isinstance(x, str) else x for k, x in v.items()}


class KindRecord:
    """Base of a workload kind's own per-request fields (its `KindSpec.record`): a frozen
    dataclass of scalars (int, float, str, bool, each may be None). A request's record carries
    them as `kind_fields`, apart from the fields every kind shares; `of` gives them back typed.

        @dataclass(frozen=True)
        class RungRecord(KindRecord):
            rung: int
            rung_tokens: int
    """

    def fields(self) -> dict[str, Scalar]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def of(cls, record: RequestRecord) -> Self | None:
        """The record's kind fields as this type; None when it has none, or they do not fit (a
        record of another kind, or a line written by hand)."""
        got = record.kind_fields
        if got is None:
            return None
        values = {}
        for name, hint in _declared(cls):  # type: ignore[arg-type]  # (a class is hashable)
            v = got.get(name)
            if not _fits(v, hint):
                return None
            values[name] = v
        return cls(**values)


@functools.cache
def _declared(cls: type) -> tuple[tuple[str, Any], ...]:
    """A KindRecord type's fields and their types, worked out once per type (not per record)."""
    hints = get_type_hints(cls)
    return tuple((f.name, hints[f.name]) for f in fields(cls))


def _fits(v: Any, hint: Any) -> bool:
    allowed = get_args(hint) or (hint,)
    if isinstance(v, bool):
        return bool in allowed
    if isinstance(v, int):
        return int in allowed or float in allowed
    return isinstance(v, tuple(a for a in allowed if isinstance(a, type)))
