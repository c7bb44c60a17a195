"""Strict TOML tables: the one reader every section of a scenario file is parsed with (its own
and each workload kind's). It remembers which keys were used, so leftovers are refused, and every
error names the file, the key path and what was expected, with a "did you mean" for a likely typo.

Hand-written rather than a validation library's: msgspec, pydantic and cattrs report a key path
and a type, but not what a key's value was expected to mean ("an integer number of tokens >= 1")
nor a close match for a mistyped key; wrapping them to do so is as much code as this."""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from harness.core.errors import InputError, read_input

T = TypeVar("T")


def describe(value: Any) -> str:
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    return repr(value)


class Table:
    """Reads one TOML table, remembering which keys were used, so leftovers can be refused."""

    def __init__(self, file: str, path: str, data: Any) -> None:
        self.file, self.path = file, path
        if not isinstance(data, dict):
            self.fail("", "expected a table", data)
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.path}.{k}" if self.path else k

    def fail(self, k: str, expected: str, got: Any) -> NoReturn:
        where = self.key(k) if k else (self.path or "(top level)")
        raise InputError(f"{self.file}: {where}: {expected}, got {describe(got)}")

    def get(self, k: str) -> Any:
        self.used.add(k)
        v = self.data.get(k)
        if any(isinstance(x, str) and "\0" in x for x in (v if isinstance(v, list) else [v])):
            self.fail(k, "expected text without NUL bytes (no path, argument or name holds one)", v)
        return v

    def has(self, k: str) -> bool:
        return k in self.data

    def known(self, *keys: str) -> None:
        """These keys are this table's, read or not (a section skipped after an error elsewhere):
        `done` does not call them unknown."""
        self.used.update(keys)

    def required(self, k: str, what: str) -> Any:
        if k not in self.data:
            # A mistyped key is the likelier mistake than a forgotten one: name it first.
            typo = difflib.get_close_matches(k, [str(x) for x in self.data if x not in self.used], n=1)
            if typo:
                raise InputError(f"{self.file}: {self.key(typo[0])}: unknown key (did you mean {k!r}?)")
            raise InputError(f"{self.file}: {self.key(k)}: missing; expected {what}")
        return self.get(k)

    def text(self, k: str, default: str | None = None, choices: tuple[str, ...] = (), required: bool = False) -> Any:
        v = self.required(k, "a string") if required else self.get(k)
        if v is None:
            return default
        if not isinstance(v, str):
            self.fail(k, "expected a string", v)
        if choices and v not in choices:
            self.fail(k, "expected one of " + ", ".join(json.dumps(c) for c in choices), v)
        return v

    def integer(
        self,
        k: str,
        default: int | None = None,
        minimum: int | None = None,
        what: str = "an integer",
        required: bool = False,
    ) -> Any:
        v = self.required(k, what) if required else self.get(k)
        if v is None:
            return default
        return self.check_int(k, v, minimum, what)

    def check_int(self, k: str, v: Any, minimum: int | None, what: str) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            self.fail(k, f"expected {what}", v)
        if minimum is not None and v < minimum:
            self.fail(k, f"expected {what} >= {minimum}", v)
        return int(v)

    def number(
        self, k: str, default: float, minimum: float | None = None, positive: bool = False, maximum: float | None = None
    ) -> float:
        v = self.get(k)
        if v is None:
            return default
        if not isinstance(v, int | float) or isinstance(v, bool):
            self.fail(k, "expected a number", v)
        if not math.isfinite(v):
            self.fail(k, "expected a finite number", v)
        if positive and v <= 0:
            self.fail(k, "expected a number > 0", v)
        if minimum is not None and v < minimum:
            self.fail(k, f"expected a number >= {minimum}", v)
        if maximum is not None and v > maximum:
            self.fail(k, f"expected a number <= {maximum:,g}", v)
        return float(v)

    def flag(self, k: str, default: bool) -> bool:
        v = self.get(k)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.fail(k, "expected true or false", v)
        return bool(v)

    def sub(self, k: str) -> Table:
        v = self.get(k)
        return Table(self.file, self.key(k), {} if v is None else v)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(self.used), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            known = ", ".join(sorted(self.used))
            raise InputError(f"{self.file}: {self.key(unknown[0])}: unknown key ({hint}known here: {known})")


class Collect:
    """Reads a file's sections one by one, keeping each one's first error and going on to the
    next, so that a file with several mistakes is told of all its sections' at once."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.errors: list[str] = []

    def __call__(self, read: Callable[..., T], *args: Any) -> T | None:
        """`read(*args)`, or None with its InputError kept."""
        try:
            return read(*args)
        except InputError as e:
            self.errors.append(str(e))
            return None

    def check(self) -> None:
        """Raise the errors kept: one as it was, several as one InputError listing each."""
        if len(self.errors) == 1:
            raise InputError(self.errors[0])
        if self.errors:
            raise InputError(f"{self.file}: {len(self.errors)} errors:\n" + "\n".join(f"  {e}" for e in self.errors))


def size(t: Table, k: str, default: int) -> int:
    from harness.core.units import parse_size

    v = t.get(k)
    if v is None:
        return default
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return v
    try:
        if not isinstance(v, str):
            raise ValueError('expected a size such as "1MiB" or a number of bytes')
        n = int(parse_size(v))
    except ValueError as e:
        t.fail(k, str(e).split(", got")[0], v)
    if n <= 0:
        t.fail(k, "expected a size > 0", v)
    return n


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """A TOML file (a scenario, gate rules), its errors naming the file and never a traceback."""
    text = read_input(path, what)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:
        raise InputError(f"{path}: tables or arrays nested too deeply") from None


def bandwidth(t: Table, key: str, text: str) -> float:
    """`text` (the value of `key`) as bytes/s: a bandwidth such as "200GB/s", above 0."""
    from harness.core.units import parse_bandwidth

    try:
        bps = parse_bandwidth(text)
    except ValueError as e:
        t.fail(key, str(e).split(", got")[0], text)
    if not bps or bps <= 0:
        t.fail(key, "expected a bandwidth > 0", text)
    return bps
