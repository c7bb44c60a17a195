"""A run's records held as columns: what the statistics core reads of each request, as numpy
arrays, and where each record's line is, to give the whole record back when it is asked for.

A record object takes about 600 bytes; the columns a closed loop's record fills take about 60
(integers in the narrowest type their values fit, a text field as small codes into its few
values, absent fields nothing), so readers hold 10^7 records in well under 1 GB (issue 56).
Fields the statistics core does not read (the prompt's id, error texts, token gaps, a kind's own
fields) stay in the file: iterating a table, or indexing it, reads those records' lines again.

Lines are checked as `RequestRecord.from_json` checks them, a column at a time: a damaged line is
left out and named with the same words.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
import orjson

from harness.core.errors import InputError, lines, open_regular
from harness.results.record import CUT_SHORT, RECORD_MAX_BYTES, TYPES, RequestRecord, kind_fields_of

# What the statistics core reads of a record, held as columns (every other field is read back
# from the record's line): numbers (an integer field in the narrowest integer type its values
# fit, a float field as float64, NaN where absent), texts with few values, and whether it succeeded
HELD_NUMBERS = (
    "target_tokens",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "start_s",
    "ttft_s",
    "first_byte_s",
    "first_content_s",
    "e2e_s",
    "worker",
    "process",
    "intended_s",
    "held_s",
    "session",
    "turn",
    "idle_s",
    "restore_tokens",
    "restore_bytes",
    "restore_s",
    "first_token_late_s",
    "first_token_shared",
    "emulator_late_s",
)
HELD_TEXTS = ("arm", "phase", "error_kind", "warm_from", "first_token_stamp")
# Whether each record succeeded, was sent again, has an error text: (field, its test)
FLAGS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "ok": ("ok", lambda v: v is True),
    "retried": ("retried", lambda v: v is True),
    "erred": ("error", lambda v: v is not None),
}
# A held text field with more distinct values than this is read back per record instead
TEXT_VALUES_MAX = 4096
BATCH_LINES = 8_192  # lines parsed and checked at once (their dicts: about 20 MB)
_INTEGER = frozenset(f for f in HELD_NUMBERS if float not in TYPES[f])
_INT_TYPES = (np.int8, np.int16, np.int32, np.int64)
_GAP_TYPES = frozenset((int, float))
NEWLINE = b"\n"
_INT64_MIN, _INT64_MAX = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)


@dataclass(frozen=True)
class Lines:
    """Records as lines of a requests file: each record's byte offset in it."""

    file: Path
    offsets: np.ndarray
    itl: bool

    def records(self, rows: Iterable[int]) -> Iterator[RequestRecord]:
        return (RequestRecord.from_json(d, self.itl) for d in self.parsed(rows))

    def parsed(self, rows: Iterable[int]) -> Iterator[dict[str, Any]]:
        """The lines of these records as parsed JSON (checked when the table was read)."""
        with open_regular(self.file, "requests file") as f:
            at = -1
            for i in rows:
                offset = int(self.offsets[i])
                if offset != at:
                    f.seek(offset)
                line = f.readline(RECORD_MAX_BYTES + 1)
                at = offset + len(line)
                try:
                    d = orjson.loads(line)
                except orjson.JSONDecodeError:
                    d = None
                if not isinstance(d, dict):
                    raise InputError(f"{self.file}: the record at byte {offset} changed since it was read")
                yield d


@dataclass(frozen=True)
class Listed:
    """Records already in memory (the run's own summary, tests)."""

    items: Sequence[RequestRecord]

    def records(self, rows: Iterable[int]) -> Iterator[RequestRecord]:
        return (self.items[i] for i in rows)

    def parsed(self, rows: Iterable[int]) -> Iterator[dict[str, Any]]:
        return (self.items[i].as_dict() for i in rows)


@dataclass(frozen=True)
class Columns:
    """The held columns of every record a table's rows are taken from, and their source."""

    n: int
    numbers: dict[str, np.ndarray]  # a held number field with any value: float64 (NaN absent) or integers
    missing: dict[str, np.ndarray]  # an integer field with absent values: True where absent
    texts: dict[str, tuple[np.ndarray, tuple[str | None, ...]]]  # codes, and the text of each code
    flags: dict[str, np.ndarray]  # FLAGS: one bool per record
    gaps: np.ndarray  # how many token gaps each record has (0 when read without them)
    source: Lines | Listed


class Table(Sequence[RequestRecord]):
    """Some of a run's records (all of them, or those a statistic selected), in their order:
    a sequence of RequestRecord whose held fields are also columns (`numbers`, `codes`, `ok`)."""

    __slots__ = ("columns", "rows")

    def __init__(self, columns: Columns, rows: np.ndarray | None = None) -> None:
        self.columns, self.rows = columns, rows

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> Table:
        """`records` as a table (itself when it is one)."""
        if isinstance(records, Table):
            return records
        items = records if isinstance(records, Sequence) else list(records)
        build = _Builder(True, TEXT_VALUES_MAX, expected=len(items))
        for start in range(0, len(items), BATCH_LINES):
            part = items[start : start + BATCH_LINES]
            build.add(len(part), functools.partial(_attributes, part), [len(r.itl_s) for r in part])
        return build.finish(Listed(items))

    def __len__(self) -> int:
        return self.columns.n if self.rows is None else len(self.rows)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"Table({len(self)} records)"

    @overload
    def __getitem__(self, i: int) -> RequestRecord: ...
    @overload
    def __getitem__(self, i: slice) -> Table: ...
    def __getitem__(self, i: int | slice) -> RequestRecord | Table:
        if isinstance(i, slice):
            return self.take(np.arange(*i.indices(len(self))))
        at = range(self.columns.n)[i] if self.rows is None else int(self.rows[i])
        return next(self.columns.source.records([at]))

    def __iter__(self) -> Iterator[RequestRecord]:
        return self.columns.source.records(self.indices())

    def parsed(self) -> Iterator[dict[str, Any]]:
        """Each record's line as parsed JSON, for a field not held (checked when read)."""
        return self.columns.source.parsed(self.indices())

    def indices(self) -> Iterable[int]:
        """The rows' places among the records they are taken from, in order."""
        return range(self.columns.n) if self.rows is None else self.rows

    def where(self, mask: np.ndarray) -> Table:
        """The rows where `mask` (one bool per row of this table) is true."""
        if mask.all():  # the common case (every request succeeded, none a warm-up): no row numbers
            return self
        if self.rows is None:
            return Table(self.columns, _rows(np.flatnonzero(mask), self.columns.n))
        return Table(self.columns, self.rows[mask])

    def take(self, at: np.ndarray) -> Table:
        """The rows at these positions of this table, in that order."""
        return Table(self.columns, _rows(np.asarray(at), self.columns.n) if self.rows is None else self.rows[at])

    def has(self, name: str) -> bool:
        """Whether any record this table's rows come from has a value of a held field."""
        return name in self.columns.numbers

    def _column(self, a: np.ndarray) -> np.ndarray:
        return a if self.rows is None else a[self.rows]

    @property
    def ok(self) -> np.ndarray:
        return self.flag("ok")

    def flag(self, name: str) -> np.ndarray:
        """One of FLAGS, a bool per record."""
        return self._column(self.columns.flags[name])

    @property
    def gap_counts(self) -> np.ndarray:
        return self._column(self.columns.gaps)

    def numbers(self, name: str) -> np.ndarray:
        """A number field as float64, NaN where a record has none (read back per record for a
        field not held)."""
        c = self.columns
        if name in c.numbers:
            values = self._column(c.numbers[name])
            if values.dtype.kind == "f":
                return values
            out = values.astype(np.float64)
            if name in c.missing:
                out[self._column(c.missing[name])] = np.nan
            return out
        if name in HELD_NUMBERS:  # held, and no record has it
            return np.full(len(self), np.nan)
        got = (getattr(r, name) for r in self)
        return np.fromiter((np.nan if v is None else v for v in got), np.float64, len(self))

    def integers(self, name: str) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A held integer field as its own narrow integers and where they are absent (None: none
        is); None for a field not held as integers."""
        c = self.columns
        if name not in c.numbers or c.numbers[name].dtype.kind != "i":
            return None
        return self._column(c.numbers[name]), self._column(c.missing[name]) if name in c.missing else None

    def codes(self, name: str) -> tuple[np.ndarray, tuple[str | None, ...]]:
        """A text field as a code per record and the text of each code (None: absent)."""
        if name in self.columns.texts:
            codes, labels = self.columns.texts[name]
            return self._column(codes), labels
        index: dict[str | None, int] = {}
        got = np.fromiter((index.setdefault(getattr(r, name), len(index)) for r in self), np.int64, len(self))
        return got, tuple(index)

    def text_is(self, name: str, value: str | None) -> np.ndarray:
        """Whether each record's text field `name` is `value`."""
        codes, labels = self.codes(name)
        return codes == labels.index(value) if value in labels else np.zeros(len(self), bool)


def _attributes(records: Sequence[RequestRecord], name: str) -> list[Any]:
    return [getattr(r, name) for r in records]


def read_table(
    file: Path,
    itl: bool = True,
    skipped: list[str] | None = None,
    *,
    batch_lines: int = BATCH_LINES,
    text_values_max: int = TEXT_VALUES_MAX,
) -> Table:
    """Every readable line of a requests file as a table. A line that is not a record (cut short,
    damaged, over RECORD_MAX_BYTES) is left out and, when `skipped` is given, said there: file,
    line and why, as read_requests says it. `batch_lines` and `text_values_max` choose how
    (BATCH_LINES, TEXT_VALUES_MAX), not what."""
    build = _Builder(itl, text_values_max)
    offsets: _Growing | None = None
    with open_regular(file, "requests file") as f:
        size = os.fstat(f.fileno()).st_size
        batch: list[tuple[int, int, bytes]] = []
        for n, offset, line in lines(f, RECORD_MAX_BYTES):
            if line is None:
                if skipped is not None:
                    skipped.append(f"{file}:{n}: longer than {RECORD_MAX_BYTES >> 20} MiB: not a record")
                continue
            batch.append((n, offset, line))
            if len(batch) == batch_lines:
                offsets = _add_batch(build, offsets, batch, size, file, skipped)
                batch = []
        if batch:
            offsets = _add_batch(build, offsets, batch, size, file, skipped)
    return build.finish(Lines(file, offsets.array() if offsets is not None else np.zeros(0, np.int64), itl))


def _add_batch(
    build: _Builder,
    offsets: _Growing | None,
    batch: list[tuple[int, int, bytes]],
    size: int,
    file: Path,
    skipped: list[str] | None,
) -> _Growing:
    """_add_lines, the columns sized at the first batch for the records the file's size holds
    at that batch's bytes per line (2 % over)."""
    if offsets is None:
        per_line = max(1, sum(len(line) for _, _, line in batch)) / len(batch)
        build.expected = int(size / per_line * 1.02) + 1
        offsets = build.column(_add_lines(build, batch, file, skipped))
    else:
        offsets.append(_add_lines(build, batch, file, skipped))
    return offsets


def _add_lines(
    build: _Builder, batch: list[tuple[int, int, bytes]], file: Path, skipped: list[str] | None
) -> np.ndarray:
    """Parses and checks a batch of (line number, offset, line), adds the records to `build`;
    their offsets. The lines left out are said in their order."""
    parsed: list[dict[str, Any]] = []
    kept: list[tuple[int, int, bytes]] = []
    left: list[tuple[int, bytes, str]] = []
    for n, offset, line in batch:
        try:
            d = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            left.append((n, line, str(e)))
            continue
        if not isinstance(d, dict):
            left.append((n, line, f"expected a JSON object, got {type(d).__name__}"))
            continue
        parsed.append(d)
        kept.append((n, offset, line))
    if bad := _bad_rows(parsed):
        left += [(kept[i][0], kept[i][2], why) for i, why in bad.items()]
        parsed = [d for i, d in enumerate(parsed) if i not in bad]
        kept = [k for i, k in enumerate(kept) if i not in bad]
    if skipped is not None:
        # the last line, written when the run was stopped, is cut short whatever else is wrong
        skipped += [f"{file}:{n}: {why if line.endswith(NEWLINE) else CUT_SHORT}" for n, line, why in sorted(left)]
    gaps = [len(d.get("itl_s") or ()) for d in parsed]
    build.add(len(parsed), lambda f: [d.get(f) for d in parsed], gaps)
    return np.asarray([offset for _, offset, _ in kept], dtype=np.int64)


def _bad_rows(parsed: list[dict[str, Any]]) -> dict[int, str]:
    """The rows of a batch that are not records, and why (RequestRecord.from_json's words); the
    common case, every value of a field of an allowed type, costs one set of types per field."""
    suspect: set[int] = set()
    bad: dict[int, str] = {}
    for f, kinds in TYPES.items():
        values = [d.get(f) for d in parsed]
        if not set(map(type, values)) <= set(kinds):
            suspect.update(i for i, v in enumerate(values) if type(v) not in kinds)
        elif f in _INTEGER and not _int64(values):  # held as int64 at most
            for i, v in enumerate(values):
                if v is not None and not _INT64_MIN <= v <= _INT64_MAX:
                    bad.setdefault(i, f"{f}: expected an integer of at most 64 bits, got {v}"[:80])
    for i, d in enumerate(parsed):
        gaps = d.get("itl_s")
        if gaps and (type(gaps) is not list or not set(map(type, gaps)) <= _GAP_TYPES):
            suspect.add(i)
        elif d.get("kind_fields") is not None:
            try:
                kind_fields_of(d["kind_fields"])
            except ValueError:
                suspect.add(i)
    for i in suspect:
        try:
            RequestRecord.from_json(parsed[i], itl=False)
        except ValueError as e:
            bad[i] = str(e)
    return bad


def _int64(values: list[Any]) -> bool:
    ints = [v for v in values if v is not None]
    return not ints or (min(ints) >= _INT64_MIN and max(ints) <= _INT64_MAX)


@dataclass
class _Growing:
    """A column appended a batch at a time to one buffer, sized for the records expected and
    widened in type as a batch needs: a table's columns built without a copy of each in pieces
    (the pieces of 10^7 records, freed, stay in the process's heap as resident memory)."""

    data: np.ndarray
    n: int = 0

    def append(self, a: np.ndarray) -> None:
        need = self.n + len(a)
        kind = np.promote_types(self.data.dtype, a.dtype)
        if need > len(self.data) or kind != self.data.dtype:
            room = len(self.data) if need <= len(self.data) else max(need, len(self.data) + len(self.data) // 2)
            grown = np.empty(room, kind)
            grown[: self.n] = self.data[: self.n]
            self.data = grown
        self.data[self.n : need] = a
        self.n = need

    def array(self, narrow: bool = False) -> np.ndarray:
        out = self.data[: self.n]
        if narrow:
            out = _narrow(out)
        elif len(self.data) > self.n + self.n // 50:  # more than 2 % spare: let it go
            out = out.copy()
        self.data = out
        out.flags.writeable = False  # shared by every table taken from it
        return out


@dataclass
class _Builder:
    """Columns gathered a batch at a time (integers at the narrowest type all fit)."""

    itl: bool
    text_values_max: int
    expected: int = 0  # the records a column's first buffer is sized for
    n: int = 0
    numbers: dict[str, _Growing] = field(default_factory=dict)
    missing: dict[str, _Growing] = field(default_factory=dict)
    texts: dict[str, dict[str | None, int]] = field(default_factory=dict)
    codes: dict[str, _Growing] = field(default_factory=dict)
    flags: dict[str, _Growing] = field(default_factory=dict)
    gaps: _Growing | None = None

    def column(self, first: np.ndarray) -> _Growing:
        """A new column, its first values `first`."""
        out = _Growing(np.empty(max(self.expected, len(first)), first.dtype))
        out.append(first)
        return out

    def _append(self, columns: dict[str, _Growing], name: str, a: np.ndarray) -> None:
        if name in columns:
            columns[name].append(a)
        else:
            columns[name] = self.column(a)

    def add(self, n: int, values: Callable[[str], list[Any]], gaps: list[int]) -> None:
        """`n` records whose values of a field are `values(field)`."""
        for f in HELD_NUMBERS:
            self._number(f, values(f), n)
        for f in HELD_TEXTS:
            self._text(f, values(f), n)
        for name, (f, test) in FLAGS.items():
            self._append(self.flags, name, np.fromiter(map(test, values(f)), bool, n))
        counts = _narrow(np.asarray(gaps if self.itl else [0] * n, dtype=np.int64))
        if self.gaps is None:
            self.gaps = self.column(counts)
        else:
            self.gaps.append(counts)
        self.n += n

    def _number(self, f: str, values: list[Any], n: int) -> None:
        absent = np.fromiter((v is None for v in values), bool, n)
        seen = f in self.numbers
        if not seen and absent.all():
            return
        if f in _INTEGER:
            a = _narrow(np.asarray([0 if v is None else v for v in values], dtype=np.int64))
            if absent.any() or f in self.missing or (not seen and self.n):
                if f not in self.missing:  # the records before: all given (seen), or none
                    self.missing[f] = self.column(np.full(self.n, not seen))
                self.missing[f].append(absent)
        else:
            a = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
        if not seen:
            self.numbers[f] = self.column(_absent(f, self.n))
        self.numbers[f].append(a)

    def _text(self, f: str, values: list[Any], n: int) -> None:
        index = self.texts.setdefault(f, {None: 0})
        if len(index) > self.text_values_max:
            return
        codes = _narrow(np.fromiter((index.setdefault(v, len(index)) for v in values), np.int64, n))
        self._append(self.codes, f, codes)
        if len(index) > self.text_values_max:  # too many to be worth holding: read back per record
            del self.codes[f]

    def finish(self, source: Lines | Listed) -> Table:
        numbers = {f: c.array() for f, c in self.numbers.items()}
        missing = {f: c.array() for f, c in self.missing.items()}
        texts = {
            f: (self.codes[f].array() if len(index) > 1 else _constant(self.n), tuple(index))
            for f, index in self.texts.items()
            if len(index) <= self.text_values_max
        }
        flags = {name: self.flags[name].array() if name in self.flags else np.zeros(0, bool) for name in FLAGS}
        gaps = self.gaps.array(narrow=True) if self.gaps is not None else np.zeros(0, np.int8)
        return Table(Columns(self.n, numbers, missing, texts, flags, gaps, source))


def _constant(n: int) -> np.ndarray:
    """n codes 0 (a text field no record has) in no memory: one value seen n times."""
    return np.broadcast_to(np.int8(0), (n,))


def _rows(at: np.ndarray, n: int) -> np.ndarray:
    """Row numbers as 32-bit integers where they fit: a subset of 10^7 rows in 40 MB, not 80."""
    return at.astype(np.int32) if n < 2**31 else at


def _absent(f: str, n: int) -> np.ndarray:
    """A column's first n values, where it had none yet."""
    return np.zeros(n, np.int8) if f in _INTEGER else np.full(n, np.nan)


def _narrow(a: np.ndarray) -> np.ndarray:
    """Integers in the narrowest type that holds them all."""
    if not len(a):
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for t in _INT_TYPES:
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return a.astype(t)
    return a
