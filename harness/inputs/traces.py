"""Request traces, read strictly, and the reuse they make possible (pure; no I/O but reading).

Formats (one JSON object per line):
- Mooncake (kvcache-ai/Mooncake): `timestamp` (ms from the trace's start), `input_length`,
  `output_length` (tokens), `hash_ids` (ints: one per `block_tokens` block of the prompt, 512 by
  default; requests sharing leading ids share those blocks and all before them).
- Qwen-Bailian (alibaba-edu/qwen-bailian-usagetraces-anon): `chat_id`, `parent_chat_id` (-1 for a
  root), `timestamp` (s), `input_length`, `output_length`, `turn`, `hash_ids` (16-token blocks);
  `type` and other keys are kept out.

Theoretical reuse: requests taken in timestamp order; a request's cached prefix is its longest
run of leading blocks that the cache holds, at most (input_length - 1) // block_tokens blocks (the
last prompt token is always computed, as every engine does); afterwards its full blocks
(input_length // block_tokens of them) are put in the cache. With an infinite cache that is the
reuse Dynamo's `datagen analyze` reports; with an LRU cache of N blocks, what a stack with that
much KV space could serve. The embedded emulator follows the same rule.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from harness.core.errors import InputError

FORMATS = ("mooncake", "bailian")
Format = Literal["mooncake", "bailian"]
BLOCK_TOKENS: dict[str, int] = {"mooncake": 512, "bailian": 16}
TIMESTAMP_TO_S = {"mooncake": 1e-3, "bailian": 1.0}
REQUIRED: dict[str, tuple[str, ...]] = {
    "mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
    "bailian": ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "hash_ids"),
}
MAX_LINE_BYTES = 16 << 20  # a trace line longer than this is not a request (bounded memory)


@dataclass(frozen=True, slots=True)
class TraceRequest:
    line: int  # 1-based line of the file
    timestamp_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    chat_id: int | None = None  # bailian: the conversation's request id
    parent_chat_id: int | None = None  # bailian: the previous turn's chat_id (-1: a root)
    turn: int | None = None


@dataclass(frozen=True)
class Trace:
    path: str
    format: Format
    block_tokens: int
    requests: tuple[TraceRequest, ...]
    skipped: tuple[str, ...] = ()  # "file:line: why", when skipping was asked for
    # lines whose input_length is more than a block away from what their hash_ids cover (at most
    # MISFIT_EXAMPLES of them, "file:line: why"), and how many there are
    misfits: tuple[str, ...] = ()
    misfit_lines: int = 0

    def misfit_warning(self) -> str | None:
        return misfit_warning(self.misfit_lines, self.block_tokens, self.misfits)


def misfit_warning(lines: int, block_tokens: int, misfits: Sequence[str]) -> str | None:
    """What to say of a trace whose lines' input_length is more than a block from what their
    hash_ids cover (`lines` of them, the first `misfits`); None if none is."""
    if not lines:
        return None
    return (
        f"{lines:,} lines' input_length is more than a block from what their hash_ids cover "
        f"({block_tokens}-token blocks: the prompt is still input_length long, its shared part is not "
        f"what the trace meant; wrong block_tokens?): {misfits[0]}"
    )


MISFIT_EXAMPLES = 5


def misfit(r: TraceRequest, block_tokens: int) -> bool:
    """Is the request's input_length more than a block outside the span its hash_ids cover
    (every block but the last whole: (n - 1) x block < input_length <= n x block)?"""
    n = len(r.hash_ids)
    return r.input_length <= (n - 2) * block_tokens or r.input_length > (n + 1) * block_tokens


def detect(first: dict[str, Any]) -> Format:
    return "bailian" if "chat_id" in first else "mooncake"


def _int(d: dict[str, Any], k: str, where: str, minimum: int | None = 0) -> int:
    v = d.get(k)  # present: required keys are checked first, optional ones read only when there
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{where}: {k}: expected an integer, got {json.dumps(v)[:40]}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{where}: {k}: expected an integer >= {minimum}, got {v}")
    return v


def parse_line(obj: Any, fmt: Format, where: str, line: int) -> TraceRequest:
    """One trace line, checked; raises ValueError naming the field."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for k in REQUIRED[fmt]:
        if k not in obj:
            raise ValueError(f"{where}: {k}: missing")
    ts = obj.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"{where}: timestamp: expected a number >= 0, got {json.dumps(ts)[:40]}")
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
        raise ValueError(f"{where}: hash_ids: expected a list of integers, got {json.dumps(ids)[:40]}")
    if ids and (min(ids) < -(1 << 63) or max(ids) >= 1 << 64):
        raise ValueError(f"{where}: hash_ids: expected integers of 64 bits (signed or not), got {json.dumps(ids)[:40]}")
    req = TraceRequest(
        line=line,
        timestamp_s=float(ts) * TIMESTAMP_TO_S[fmt],
        input_length=_int(obj, "input_length", where, 1),
        output_length=_int(obj, "output_length", where, 0),
        hash_ids=tuple(ids),
    )
    if fmt == "bailian":
        req = TraceRequest(
            req.line,
            req.timestamp_s,
            req.input_length,
            req.output_length,
            req.hash_ids,
            chat_id=_int(obj, "chat_id", where, None),
            parent_chat_id=_int(obj, "parent_chat_id", where, -1),
            turn=_int(obj, "turn", where, 0) if "turn" in obj else None,
        )
    return req


class Reading:
    """A trace file read a line at a time (`requests()`), each line checked: a bad line is an
    InputError naming file, line and field, or (skip_bad) left out and said in `skipped`.
    Timestamps must not go backwards (replay order is file order), and no request may be longer
    than `max_model_len` (`context_from`: where that limit comes from, as ", KEY"). What it has
    found so far: the format, the block size, the lines left out and those whose input_length is
    more than a block from what their hash_ids cover (`misfits`: the first MISFIT_EXAMPLES)."""

    def __init__(
        self,
        path: str | Path,
        fmt: str = "auto",
        block_tokens: int | None = None,
        skip_bad: bool = False,
        max_model_len: int | None = None,
        context_from: str = "",
    ) -> None:
        self.path = Path(path)
        self.format: Format | None = None if fmt == "auto" else _format(fmt)
        self.block_tokens = block_tokens
        self.skip_bad, self.max_model_len, self.context_from = skip_bad, max_model_len, context_from
        self.skipped: list[str] = []
        self.misfits: list[str] = []
        self.misfit_lines = 0

    @property
    def block(self) -> int:
        assert self.format is not None  # (known from the first line read)
        return self.block_tokens or BLOCK_TOKENS[self.format]

    def misfit_warning(self) -> str | None:
        """`misfit_warning` of the lines read so far."""
        return misfit_warning(self.misfit_lines, self.block, self.misfits)

    def requests(self) -> Iterator[TraceRequest]:
        p, last_ts = self.path, 0.0
        try:
            f = p.open("rb")
        except OSError as e:
            raise InputError(f"{p}: cannot read the trace: {e.strerror or e}") from None
        with f:
            for n, raw in enumerate(_lines(f, p), 1):
                if not raw.strip():
                    continue
                req = self._checked(raw, f"{p}:{n}", n, last_ts)
                if req is None:
                    continue
                last_ts = req.timestamp_s
                if misfit(req, self.block):
                    self.misfit_lines += 1
                    if len(self.misfits) < MISFIT_EXAMPLES:
                        self.misfits.append(
                            f"{p}:{n}: input_length {req.input_length:,} with {len(req.hash_ids)} hash_ids"
                        )
                yield req

    def _checked(self, raw: bytes, where: str, n: int, last_ts: float) -> TraceRequest | None:
        """The line's request; None for a bad line left out (skip_bad)."""
        try:
            obj = json.loads(raw)
            self.format = self.format or detect(obj if isinstance(obj, dict) else {})
            req = parse_line(obj, self.format, where, n)
            if req.timestamp_s < last_ts:
                raise ValueError(f"{where}: timestamp: goes backwards ({req.timestamp_s:g} s after {last_ts:g} s)")
            if self.max_model_len is not None and req.input_length + req.output_length > self.max_model_len:
                raise ValueError(
                    f"{where}: input_length: {req.input_length:,} + output_length {req.output_length:,} "
                    f"exceeds the model's context ({self.max_model_len:,} tokens{self.context_from})"
                )
        except (ValueError, RecursionError) as e:  # json's errors are ValueErrors too
            what = "nested too deeply" if isinstance(e, RecursionError) else e
            text = str(e) if str(e).startswith(where) else f"{where}: not JSON: {what}"
            if not self.skip_bad:
                raise InputError(text) from None
            self.skipped.append(text)
            return None
        return req


def read(
    path: str | Path,
    fmt: str = "auto",
    block_tokens: int | None = None,
    skip_bad: bool = False,
    max_model_len: int | None = None,
    context_from: str = "",
) -> Trace:
    """A trace file, every request in memory (`Reading` says what is checked)."""
    reading = Reading(path, fmt, block_tokens, skip_bad, max_model_len, context_from)
    requests = tuple(reading.requests())
    if not requests:
        raise InputError(f"{reading.path}: no trace requests in it")
    assert reading.format is not None
    return Trace(
        str(reading.path),
        reading.format,
        reading.block,
        requests,
        tuple(reading.skipped),
        tuple(reading.misfits),
        reading.misfit_lines,
    )


def _lines(f: Any, p: Path) -> Iterable[bytes]:
    while True:
        line = f.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise InputError(f"{p}: a line longer than {MAX_LINE_BYTES >> 20} MiB: not a trace")
        yield line


def _format(fmt: str) -> Format:
    if fmt not in FORMATS:
        raise InputError(f"trace format: expected auto, {' or '.join(FORMATS)}, got {fmt!r}")
    return fmt  # type: ignore[return-value]


@dataclass(frozen=True)
class Reuse:
    capacity_blocks: int | None  # None: infinite
    prompt_tokens: int
    cached_tokens: int

    @property
    def share(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


def reuse_served(requests: Sequence[TraceRequest], block_tokens: int, server_block: int, head: int) -> Reuse:
    """The prompt tokens an infinite prefix cache of `server_block`-token blocks could serve when
    kvbench replays the requests (prompts.BlockPrompts): `head` tokens (the chat template's and
    the lead's) before the trace's blocks, shared by every prompt of a reuse arm; block k of a
    request is `block_tokens` tokens of its id's text, the last one (partial) the start of it.
    A request shares with the earlier ones its longest common prefix in tokens, and a server
    caches the whole server blocks of that, and never the prompt's last token. It counts the
    template's tail with the head (it cannot tell them apart), so it is an upper bound on what
    the server can report cached: captured <= 100 % by construction."""
    longest: dict[tuple[Any, ...], int] = {}  # a block's prefix chain -> its longest length seen
    total = cached = 0
    for n, r in enumerate(sorted(requests, key=lambda r: r.timestamp_s)):
        full = min(len(r.hash_ids), max(0, r.input_length - head) // block_tokens)
        left = r.input_length - head - full * block_tokens
        lengths = [block_tokens] * full + ([left] if full < len(r.hash_ids) and left > 0 else [])
        shared, chain = 0, []
        key: tuple[Any, ...] = ()
        for k, length in enumerate(lengths):
            key = (key, r.hash_ids[k])
            chain.append(key)
            if shared == k * block_tokens:  # still on the common prefix
                shared += min(length, longest.get(key, 0))
        for key, length in zip(chain, lengths, strict=True):
            longest[key] = max(longest.get(key, 0), length)
        prefix = (head if n else 0) + shared
        total += r.input_length
        cached += min(prefix, r.input_length - 1) // server_block * server_block
    return Reuse(None, total, cached)


def reuse(requests: Sequence[TraceRequest], block_tokens: int, capacity_blocks: int | None = None) -> Reuse:
    """The prompt tokens a prefix cache of `capacity_blocks` blocks (LRU; None: infinite) would
    serve over the requests (see the module's definition)."""
    cache: OrderedDict[int, None] = OrderedDict()
    total = cached = 0
    for r in sorted(requests, key=lambda r: r.timestamp_s):
        ids = r.hash_ids
        usable = min(len(ids), (r.input_length - 1) // block_tokens)
        hit = 0
        while hit < usable and ids[hit] in cache:
            cache.move_to_end(ids[hit])
            hit += 1
        total += r.input_length
        cached += hit * block_tokens
        for h in ids[: min(len(ids), r.input_length // block_tokens)]:
            if h in cache:
                cache.move_to_end(h)
            else:
                cache[h] = None
                if capacity_blocks is not None and len(cache) > capacity_blocks:
                    cache.popitem(last=False)
    return Reuse(capacity_blocks, total, cached)
