"""`kind = "trace"`'s spec: its `[workload]` keys (the trace file, its format, the slice replayed,
its speed or a concurrency); workloads/trace.py replays it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Self

from harness.config.kinds import OPEN_LOOP_CONNECTIONS, KindSpec, WorkloadConfig
from harness.config.tables import Table
from harness.core.errors import InputError
from harness.inputs import traces

if TYPE_CHECKING:
    from harness.config.context import Context


@dataclass(frozen=True, kw_only=True)
class TraceConfig(WorkloadConfig):
    kind: str = "trace"
    path: str
    trace_format: Literal["auto", "mooncake", "bailian"] = "auto"
    block_tokens: int | None = None  # tokens per hash_ids block (default: the format's)
    speed: float = 1.0  # timestamps replayed this many times faster
    start_s: float = 0.0  # the slice of the trace replayed: [start_s, end_s) after its first request
    end_s: float | None = None
    max_requests: int | None = None
    skip_bad: bool = False  # leave bad trace lines out (counted) instead of stopping
    lru_blocks: tuple[int, ...] = ()  # also the reuse possible with LRU caches of these many trace blocks
    concurrency: int | None = None  # as fast as that many connections allow, instead of the timestamps

    @classmethod
    def parse(cls, t: Table) -> Self:
        concurrency = t.integer("concurrency", None, minimum=1, what="an integer number of connections")
        if concurrency is not None and t.has("speed"):
            t.fail("speed", "applies when the trace's timestamps are kept (no concurrency)", t.data["speed"])
        w = cls(
            path=t.text("path", required=True),
            trace_format=t.text("format", cls.trace_format, ("auto", "mooncake", "bailian")),
            block_tokens=t.integer("block_tokens", None, minimum=1, what="an integer number of tokens"),
            speed=t.number("speed", cls.speed, positive=True),
            start_s=t.number("start_s", cls.start_s, minimum=0.0),
            end_s=t.number("end_s", 0.0, positive=True) or None,
            max_requests=t.integer("max_requests", None, minimum=1, what="an integer number of requests"),
            skip_bad=t.flag("skip_bad", cls.skip_bad),
            lru_blocks=_lru_blocks(t),
            concurrency=concurrency,
        )
        if w.end_s is not None and w.end_s <= w.start_s:
            t.fail("end_s", f"expected more than start_s ({w.start_s:g})", w.end_s)
        return w

    @property
    def closed(self) -> bool:
        """`concurrency` given: as fast as that many connections allow."""
        return self.concurrency is not None

    def check_files(self, scenario_path: str) -> None:
        if not Path(self.path).is_file():
            raise InputError(
                f"{scenario_path}: workload.path: no trace file {self.path!r} "
                "(paths are relative to the current directory)"
            )

    def connections(self) -> int:
        return self.concurrency or OPEN_LOOP_CONNECTIONS

    def read(self, context: Context) -> tuple[traces.Trace, list[str]]:
        """The trace, every line checked against the model's context, and what to warn of it."""
        trace = traces.read(
            self.path, self.trace_format, self.block_tokens, self.skip_bad, context.tokens, f", {context.source}"
        )
        warnings = [w for w in (trace.misfit_warning(),) if w is not None]
        if trace.skipped:
            n = len(trace.skipped)
            more = f" (and {n - 1} more)" if n > 1 else ""
            lines = "lines" if n > 1 else "line"
            warnings.append(f"{n} bad {lines} of the trace skipped (skip_bad = true): {trace.skipped[0]}{more}")
        return trace, warnings

    def check_inputs(self, context: Context) -> tuple[str, list[str]]:
        trace, warnings = self.read(context)
        return f"trace {self.path}: {len(trace.requests):,} requests", warnings

    def output_lengths(self, out: int, context: Context) -> frozenset[int]:
        trace, _ = self.read(context)  # (its warnings are the run's to give)
        replayed = select(trace.requests, self.start_s, self.end_s, self.max_requests)
        return frozenset(r.output_length or out for r in replayed)


def _lru_blocks(t: Table) -> tuple[int, ...]:
    v = t.get("lru_blocks")
    if v is None:
        return ()
    if not isinstance(v, list) or not v:
        t.fail("lru_blocks", "expected a non-empty list of cache sizes in trace blocks", v)
    return tuple(
        sorted({t.check_int(f"lru_blocks[{i}]", n, 1, "an integer number of blocks") for i, n in enumerate(v)})
    )


def select(
    reqs: Sequence[traces.TraceRequest], start_s: float, end_s: float | None, cap: int | None
) -> list[traces.TraceRequest]:
    """The slice replayed: [start_s, end_s) after the trace's first request, at most `cap`."""
    t0 = reqs[0].timestamp_s
    out = [r for r in reqs if start_s <= r.timestamp_s - t0 and (end_s is None or r.timestamp_s - t0 < end_s)]
    return out[:cap] if cap is not None else out


SPEC = KindSpec(
    name="trace",
    config=TraceConfig,
    figures="harness.analysis.kinds.trace:FIGURES",
    driver="harness.workloads.trace:DRIVER",
    report_sections=("versus_recompute",),
)
