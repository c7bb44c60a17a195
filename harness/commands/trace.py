"""`kvbench trace inspect FILE`: what a request trace holds and the reuse it makes possible:
request count and span, input and output length distributions, the arrival rate over time, and
the share of prompt tokens an infinite prefix cache, and LRU caches of the sizes given, would
serve (harness/inputs/traces.py defines it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.analysis import stats
from harness.config.context import MAX_CONTEXT_TOKENS
from harness.core.errors import ExitCode, InputError
from harness.inputs import traces

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
    if block_tokens is not None and block_tokens < 1:
        raise InputError(f"--block-tokens: expected an integer >= 1, got {block_tokens}")
    if any(n < 1 for n in lru_blocks):
        raise InputError(f"--lru-blocks: expected integers >= 1, got {min(lru_blocks)}")
    if max_context_tokens is not None and max_context_tokens < 1:
        raise InputError(f"--max-context-tokens: expected an integer >= 1, got {max_context_tokens}")
    context = max_context_tokens or MAX_CONTEXT_TOKENS
    trace = traces.read(file, fmt, block_tokens, skip_bad, context, ", --max-context-tokens")
    doc = inspect(trace, lru_blocks)
    show(doc, console)
    if json_out is not None:
        from harness.core.errors import write_file

        write_file(json_out, json.dumps(doc, indent=1) + "\n")
    return ExitCode.OK
