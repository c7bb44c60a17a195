"""`kind = "trace"`'s figures: those of a kind whose requests reuse each other's prefixes, its report
section (the reuse captured against what was possible), and what its prompts share (its trace's
to say)."""

from __future__ import annotations

from typing import Any

from harness.analysis import stats
from harness.analysis.kinds import Parts, ReusesAcrossRequests, Section
from harness.core.errors import InputError
from harness.results import RequestRecord, RunResult

READ = (
    'How to read this: "possible" is the share of the replayed requests\' prompt tokens that an infinite '
    "prefix cache could serve. Where the server's block size is known it is counted as the server would "
    "count it, over the prompts as kvbench built them: each request's longest common prefix with the "
    "requests before it (the chat template's opening and the lead included), in whole server blocks, never "
    'the last token; it is then an upper bound on what the server can report, so "captured" never passes '
    "100 %. Where the block size is not known it is counted in the trace's own blocks (kvbench trace "
    'inspect computes that figure), and the template\'s opening can take "captured" past 100 % by a little. '
    'The basis is given in each row. "Served" is the share the server reported as cached tokens; '
    '"captured" is served over possible, and what it lacks of 100 % is what the server did not keep or '
    'find: blocks evicted, a tier it could not reach, prefixes it does not look up. "By tier" is where '
    "the server's own counters say the hits came from. Rows of an LRU cache: what one of that many of the "
    "trace's blocks could serve, and the share of it captured."
)
COLUMNS = ("run", "trace", "requests", "possible", "served", "captured", "by tier (tokens)", "possible counted in")


class TraceFigures(ReusesAcrossRequests):
    def prompt_parts(self, run: RunResult, record: RequestRecord) -> Parts:
        """The trace's block ids say what a replayed request shares: size the trace itself."""
        path = (run.scenario.get("workload") or {}).get("path")
        raise InputError(
            f"{run.folder}: a trace replay: its requests share what its trace's block ids say; size the "
            f"trace itself ([workload] trace = {str(path)!r}, rate_scale for the replay's speed)"
        )

    def sections(self, runs: list[RunResult]) -> list[Section]:
        rows: list[tuple[Any, ...]] = []
        for run in runs:
            if (c := captured_reuse(run)) is None:
                continue
            tiers = "; ".join(f"{t}: {v:,.0f}" for t, v in c["by_tier"].items()) or "-"
            share, served = _percent(c["possible_share"]), _percent(c["cached_share"])
            rows.append(
                (
                    c["label"],
                    c["trace"],
                    c["requests"],
                    share,
                    served,
                    _percent(c["captured"], 0),
                    tiers,
                    c["basis"] or "-",
                )
            )
            for u in c["possible_lru"]:
                lru = f"an LRU cache of {u['capacity_blocks']:,} blocks"
                rows.append(
                    (c["label"], lru, "", _percent(u.get("cached_share")), served, _percent(u["captured"], 0), "", "")
                )
        if not rows:
            return []
        return [Section("Trace replay: the reuse captured", READ, COLUMNS, tuple(rows))]


def _percent(share: float | None, digits: int = 1) -> str:
    return "-" if share is None else f"{share * 100:.{digits}f} %"


def captured_reuse(run: RunResult) -> dict[str, Any] | None:
    """A trace replay's reuse: what was possible (an infinite prefix cache, from run.json's
    trace), what the server reported cached, their ratio, and where the server's counters say
    the hits came from (per tier where it exports that, else device vs external)."""
    trace = run.meta.get("trace")
    if not isinstance(trace, dict):
        return None
    possible, measured = trace.get("possible_cached_share"), stats.cached_share(run.records)
    mapped = ((run.server_metrics or {}).get("phases", {}).get("run") or {}).get("mapped") or {}
    if isinstance(mapped.get("tier_hit_tokens"), dict):  # the emulator: G1 .. G4
        by_tier = {str(k): float(v) for k, v in mapped["tier_hit_tokens"].items() if _count(v)}
    elif isinstance(mapped.get("cached_tokens_by_source"), dict):  # vLLM 0.32+: device, host, p2p, disk
        by_tier = {str(k): float(v) for k, v in mapped["cached_tokens_by_source"].items() if _count(v) and v}
    else:  # vLLM and the like: the GPU's own prefix cache, and what came from outside it
        pairs = (("device", "prefix_cache_hit_tokens"), ("external", "external_hit_tokens"))
        by_tier = {k: float(mapped[f]) for k, f in pairs if mapped.get(f)}
    return {
        "label": run.label,
        "trace": trace.get("file"),
        "requests": trace.get("requests"),
        "possible_share": possible,
        "basis": trace.get("possible_basis"),
        "cached_share": measured,
        "captured": measured / possible if measured is not None and possible else None,
        "possible_lru": [
            {**u, "captured": measured / u["cached_share"] if measured is not None and u.get("cached_share") else None}
            for u in trace.get("possible_lru") or []
            if isinstance(u, dict)
        ],
        "by_tier": by_tier,
    }


def _count(v: object) -> bool:
    """A tier's count as metrics.json holds it: a number (anything else in a damaged file is left out)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


FIGURES = TraceFigures()
