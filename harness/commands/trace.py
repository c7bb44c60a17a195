"""`kvbench trace inspect FILE`: what a request trace holds and the reuse it makes possible:
request count and span, input and output length distributions, the arrival rate over time, and
the share of prompt tokens an infinite prefix cache, and LRU caches of the sizes given, would
serve (harness/inputs/traces.py defines it).

`kvbench trace curve FILE [--sample RATE]`: the share an LRU prefix cache of every capacity
would serve, in one pass, streamed from the file in memory bounded by the sample
(harness/sizing/streamed.py; docs/sizing.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from harness.analysis import stats
from harness.config.context import MAX_CONTEXT_TOKENS
from harness.core.errors import ExitCode, InputError
from harness.inputs import traces
from harness.sizing import stack, streamed
from harness.sizing.stack import SAMPLE_MODULUS, References, TraceColumns, columns_references

RATE_WINDOWS = 10  # the arrival rate over time: the span cut into this many equal windows


def inspect(trace: traces.Trace, lru_blocks: list[int]) -> dict[str, Any]:
    reqs = trace.requests
    t = [r.timestamp_s for r in reqs]
    span = t[-1] - t[0]
    windows = []
    if span > 0:
        width = span / RATE_WINDOWS
        counts = [0] * RATE_WINDOWS
        for x in t:
            counts[min(RATE_WINDOWS - 1, int((x - t[0]) / width))] += 1
        windows = [{"start_s": k * width, "req_per_s": c / width} for k, c in enumerate(counts)]
    sizes = [None, *sorted(set(lru_blocks))]
    return {
        "file": trace.path,
        "format": trace.format,
        "block_tokens": trace.block_tokens,
        "requests": len(reqs),
        "skipped_lines": list(trace.skipped),
        "misfit_lines": trace.misfit_lines,
        "misfits": list(trace.misfits),
        "span_s": span,
        "mean_req_per_s": (len(reqs) - 1) / span if span > 0 else None,
        "input_length": stats.describe([r.input_length for r in reqs]),
        "output_length": stats.describe([r.output_length for r in reqs]),
        "arrival_rate": windows,
        "reuse": [
            {
                "capacity_blocks": (u := traces.reuse(reqs, trace.block_tokens, n)).capacity_blocks,
                "share": u.share,
                "cached_tokens": u.cached_tokens,
                "prompt_tokens": u.prompt_tokens,
            }
            for n in sizes
        ],
    }


def show(doc: dict[str, Any], console: Console) -> None:
    span = doc["span_s"]
    rate = doc["mean_req_per_s"]
    console.print(
        f"{doc['file']}: {doc['requests']:,} requests ({doc['format']} format, {doc['block_tokens']}-token blocks) "
        f"over {span:,.1f} s" + (f", {rate:.3g} req/s on average" if rate else ""),
        markup=False,
    )
    if doc["skipped_lines"]:
        console.print(f"{len(doc['skipped_lines'])} lines left out; the first: {doc['skipped_lines'][0]}", markup=False)
    if doc["misfit_lines"]:
        console.print(
            f"warning: {doc['misfit_lines']:,} lines' input_length is more than a block from what their hash_ids "
            f"cover ({doc['block_tokens']}-token blocks; wrong --block-tokens?); the first: {doc['misfits'][0]}",
            markup=False,
        )
    lengths = Table(title="lengths (tokens)")
    for col in ("", "mean", "p50", "p90", "p99", "min", "max"):
        lengths.add_column(col, justify="right")
    for name in ("input_length", "output_length"):
        d = doc[name]
        lengths.add_row(name.split("_")[0], *(f"{d[k]:,.0f}" for k in ("mean", "p50", "p90", "p99", "min", "max")))
    console.print(lengths)
    if doc["arrival_rate"]:
        rates = ", ".join(f"{w['req_per_s']:.3g}" for w in doc["arrival_rate"])
        console.print(f"arrival rate (req/s) in {RATE_WINDOWS} equal windows: {rates}", markup=False)
    reuse = Table(title="prompt tokens a prefix cache would serve")
    for col in ("cache", "blocks", "share", "cached tokens"):
        reuse.add_column(col, justify="right")
    for u in doc["reuse"]:
        n = u["capacity_blocks"]
        reuse.add_row(
            "infinite" if n is None else "LRU",
            "-" if n is None else f"{n:,}",
            "-" if u["share"] is None else f"{u['share']:.1%}",
            f"{u['cached_tokens']:,} of {u['prompt_tokens']:,}",
        )
    console.print(reuse)


def main(
    file: Path,
    fmt: str,
    block_tokens: int | None,
    lru_blocks: list[int],
    skip_bad: bool,
    json_out: Path | None,
    console: Console,
    max_context_tokens: int | None = None,
) -> int:
    if any(n < 1 for n in lru_blocks):
        raise InputError(f"--lru-blocks: expected integers >= 1, got {min(lru_blocks)}")
    context = _context(block_tokens, max_context_tokens)
    trace = traces.read(file, fmt, block_tokens, skip_bad, context, ", --max-context-tokens")
    doc = inspect(trace, lru_blocks)
    show(doc, console)
    if json_out is not None:
        from harness.core.errors import write_file

        write_file(json_out, json.dumps(doc, indent=1) + "\n")
    return ExitCode.OK


# Requests read, referenced and streamed at a time (bounded memory): this many, or fewer where their
# hash ids reach CHUNK_IDS (a line may hold 16 MiB of them).
CHUNK_REQUESTS = 32_768
CHUNK_IDS = 1 << 20


def curve_doc(trace: dict[str, Any], s: streamed.Streamed, kv_bytes_per_token: float | None) -> dict[str, Any]:
    """What `kvbench trace curve` gives: the curve at every capacity where it rises, at every
    power of two of blocks up to past its last rise, and its knee among those."""
    c, block = s.curve, trace["block_tokens"]
    top = int(c.distances[-1]) + 1 if len(c.distances) else 1
    # to the first power of two past the last rise, and one more (a doubling that adds nothing:
    # the knee is always among them); bin edges all, the curve exact there
    powers = [1 << e for e in range((top - 1).bit_length() + 2)]
    shares = [float(x) for x in c.share(np.asarray(powers))] if c.prompt_tokens else [0.0] * len(powers)
    knee = stack.knee(powers, shares)
    return {
        **trace,
        "requests": s.requests,
        "references": s.references,
        "prompt_tokens": c.prompt_tokens,
        "kv_bytes_per_token": kv_bytes_per_token,
        "sample": {
            "rate": c.rate,
            "kept_references": s.kept,
            "heavy_blocks": s.heavy_blocks,
            "heavy_references": s.heavy_references,
            "error_estimate": s.error,
            "skewed": s.references > 0 and s.heavy_references >= streamed.SKEWED * s.references,
            "sketch": None if c.rate == 1 else {"rows": streamed.SKETCH_ROWS, "width": streamed.SKETCH_WIDTH},
        },
        "resolution": f"exact below {stack.EXACT_BINS} blocks, then {stack.BINS_PER_DOUBLING} steps a doubling",
        "curve": [
            {"capacity_blocks": int(d) + 1, "share": float(t) / c.prompt_tokens, "cached_tokens": float(t)}
            for d, t in zip(c.distances, c.tokens, strict=True)
        ],
        "points": [
            {"capacity_blocks": n, "capacity_bytes": _bytes(n, block, kv_bytes_per_token), "share": x}
            for n, x in zip(powers, shares, strict=True)
        ],
        "knee_blocks": knee,
        "knee_bytes": None if knee is None else _bytes(knee, block, kv_bytes_per_token),
    }


def _bytes(blocks: int, block_tokens: int, kv_bytes_per_token: float | None) -> float | None:
    return None if kv_bytes_per_token is None else blocks * block_tokens * kv_bytes_per_token


def show_curve(doc: dict[str, Any], console: Console) -> None:
    sample = doc["sample"]
    console.print(
        f"{doc['file']}: {doc['requests']:,} requests, {doc['references']:,} block references "
        f"({doc['format']} format, {doc['block_tokens']}-token blocks)",
        markup=False,
    )
    if doc["skipped_lines"]:
        console.print(f"{len(doc['skipped_lines'])} lines left out; the first: {doc['skipped_lines'][0]}", markup=False)
    if doc["misfit_warning"]:
        console.print(f"warning: {doc['misfit_warning']}", markup=False)
    if sample["rate"] < 1:
        console.print(
            f"sampled (SHARDS) at {sample['rate']:.3g}: {sample['kept_references']:,} references kept "
            f"({sample['kept_references'] / max(1, doc['references']):.1%}), {sample['heavy_blocks']:,} blocks "
            f"referenced 1/rate times or more kept whole; estimated error of the shares: "
            f"{sample['error_estimate']:.4f}",
            markup=False,
        )
    if sample["skewed"]:
        console.print(
            f"warning: the heavy blocks are {sample['heavy_references'] / doc['references']:.0%} of the references: "
            "on traces this skewed the sample leans high by more than its estimated error shows (measured 2-20x "
            "the estimate, docs/sizing.md); sample at a higher rate, or keep every block",
            markup=False,
        )
    table = Table(title=f"prompt tokens an LRU prefix cache would serve ({doc['resolution']})")
    with_bytes = doc["kv_bytes_per_token"] is not None
    for col in ("capacity (blocks)", "tokens", *(("bytes",) if with_bytes else ()), "share"):
        table.add_column(col, justify="right")
    for p in doc["points"]:
        n = p["capacity_blocks"]
        size = (f"{p['capacity_bytes']:,.0f}",) if with_bytes else ()
        table.add_row(f"{n:,}", f"{n * doc['block_tokens']:,}", *size, f"{p['share']:.1%}")
    console.print(table)
    if doc["knee_blocks"] is not None:
        in_bytes = f" ({doc['knee_bytes']:,.0f} bytes)" if with_bytes else ""
        console.print(
            f"knee: {doc['knee_blocks']:,} blocks{in_bytes}; past it each doubling adds less than "
            f"{stack.KNEE_GAIN:.0%} of the prompt tokens",
            markup=False,
        )


def curve_main(
    file: Path,
    fmt: str,
    block_tokens: int | None,
    rate: float,
    seed: int,
    kv_bytes_per_token: float | None,
    skip_bad: bool,
    json_out: Path | None,
    console: Console,
    max_context_tokens: int | None = None,
) -> int:
    if not streamed.HALVES / SAMPLE_MODULUS <= rate <= 1:  # (each half of the sample a hash at least)
        raise InputError(
            f"--sample: expected a sampling rate from {streamed.HALVES}/{SAMPLE_MODULUS:,} to 1, got {rate}"
        )
    if kv_bytes_per_token is not None and not 0 < kv_bytes_per_token < math.inf:
        raise InputError(f"--kv-bytes-per-token: expected a number > 0, got {kv_bytes_per_token}")
    context = _context(block_tokens, max_context_tokens)

    def reading() -> traces.Reading:
        return traces.Reading(file, fmt, block_tokens, skip_bad, context, ", --max-context-tokens")

    sketch = None
    if rate < 1:
        sketch = streamed.Sketch()
        streamed.counted(_chunks(reading()), sketch)
    second = reading()
    s = streamed.streamed(_chunks(second), rate, sketch, seed)
    if not s.requests:
        raise InputError(f"{second.path}: no trace requests in it")
    trace = {
        "file": str(second.path),
        "format": second.format,
        "block_tokens": second.block,
        "skipped_lines": second.skipped,
        "misfit_lines": second.misfit_lines,
        "misfit_warning": second.misfit_warning(),
    }
    doc = curve_doc(trace, s, kv_bytes_per_token)
    show_curve(doc, console)
    if json_out is not None:
        from harness.core.errors import write_file

        write_file(json_out, json.dumps(doc, indent=1) + "\n")
    return ExitCode.OK


def _context(block_tokens: int | None, max_context_tokens: int | None) -> int:
    """The options both commands share, checked; the longest request a line may ask for."""
    if block_tokens is not None and block_tokens < 1:
        raise InputError(f"--block-tokens: expected an integer >= 1, got {block_tokens}")
    if max_context_tokens is not None and max_context_tokens < 1:
        raise InputError(f"--max-context-tokens: expected an integer >= 1, got {max_context_tokens}")
    return max_context_tokens or MAX_CONTEXT_TOKENS


def _chunks(reading: traces.Reading) -> Iterator[References]:
    """The trace's references, CHUNK_REQUESTS requests at a time (the file is in time order:
    `Reading` refuses a timestamp that goes back)."""
    requests = reading.requests()
    while (c := TraceColumns.of(_chunk(requests))).requests:
        yield columns_references(c, reading.block)


def _chunk(requests: Iterator[traces.TraceRequest]) -> Iterator[traces.TraceRequest]:
    """The next CHUNK_REQUESTS requests, or fewer whose hash ids reach CHUNK_IDS (none read past)."""
    ids = 0
    for n, r in enumerate(requests, 1):
        yield r
        ids += len(r.hash_ids)
        if n == CHUNK_REQUESTS or ids >= CHUNK_IDS:
            return
