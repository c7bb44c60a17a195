"""`kind = "closed_loop"`'s figures: its throughput is what competing traffic is judged by; its
report section (throughput against the paper's, the restores kvbench made), its key figures and
the claims audit's throughputs; and its plan in tokens, for `kvbench size`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.analysis import findings, stats
from harness.analysis.kinds import Demand, Figures, pool_demand, restore_parts
from harness.analysis.kinds.document import Bars, Card, Paragraph, Part, Section, Table
from harness.config import reference
from harness.config.kinds.closed_loop import ClosedLoopConfig
from harness.results import RunResult

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

# (reference test, arm) -> the measured figure of the claims audit it provides
CLAIM_KEYS = {
    ("concurrency", "recompute"): "recompute_req_per_s",
    ("concurrency", "cached"): "cached_req_per_s",
    ("competing_traffic", "traffic"): "traffic_req_per_s",
    # the clean arm of a traffic run: the fairest base for its drop (same prompts, same time)
    ("competing_traffic", "clean"): "clean_req_per_s",
}
READ = (
    "How to read this: req/s = completed requests / (last end - first start), as the paper defines it, so it "
    "includes ramp-up and drain (and, with an empty cache at the start, the warm-up). Steady-state req/s counts "
    "only completions between the 10th and 90th percentile of end times. Hatched bars are the published figures."
)
COLUMNS = (
    "run",
    "completed",
    "failed",
    "req/s",
    "published req/s",
    "steady-state req/s",
    "output tok/s",
    "duration (s)",
    "connections",
    "mean in flight",
    "TTFT p50 (s)",
    "TTFT p90 (s)",
    "TTFT p99 (s)",
)


class ClosedLoopFigures(Figures):
    def traffic_req_per_s(self, s: dict[str, Any]) -> float | None:
        return s.get("req_per_s")

    def demand(self, sc: Scenario) -> Demand:
        """The schedule's requests, each sent as soon as one of `concurrency` connections is free."""
        w = sc.workload
        assert isinstance(w, ClosedLoopConfig)
        return pool_demand(sc, w, w.schedule_picks(sc.prompts.seed), (0.0,) * w.requests, w.concurrency)

    def claimed(self, run: RunResult) -> dict[str, float]:
        """The run's req/s, where its (reference test, arm) reproduces one the paper publishes."""
        key = CLAIM_KEYS.get((run.reference_test or "", run.arm))
        got = stats.throughput(run.records).req_per_s
        return {key: got} if key and got is not None else {}

    def cards(self, runs: list[RunResult]) -> list[Card]:
        """Each run's req/s, beside the paper's where it has one."""
        out = []
        for run in runs:
            if (got := stats.throughput(run.records).req_per_s) is not None:
                pub = reference.req_per_s(run.reference_test, run.arm)
                out.append(Card(f"{run.label} throughput", f"{got:.3g} req/s", f"{pub:g} req/s" if pub else None))
        return out

    def sections(self, runs: list[RunResult]) -> list[Section]:
        """Each run's throughput beside the paper's, with its latency; the restores kvbench made
        before requests, where it made them."""
        rows, measured, published = [], [], []
        for r in runs:
            t = stats.throughput(r.records)
            ttft = stats.describe(stats.values(r.records, "ttft_s"))
            pub = reference.req_per_s(r.reference_test, r.arm)
            rows.append(
                (
                    r.label,
                    t.completed,
                    t.failed,
                    t.req_per_s,
                    pub,
                    t.steady_req_per_s,
                    t.output_tokens_per_s,
                    t.duration_s,
                    r.scenario.get("workload", {}).get("concurrency"),
                    t.mean_concurrency,
                    ttft["p50"],
                    ttft["p90"],
                    ttft["p99"],
                )
            )
            measured.append(t.req_per_s)
            published.append(pub)
        labels = tuple(r.label for r in runs)
        caption = "Requests per second, measured and published."
        bars = Bars(caption, "requests per second", labels, tuple(measured), tuple(published))
        parts: list[Part] = [bars, Table(COLUMNS, tuple(rows))]
        for r in runs:
            parts += _restored(r)
        return [Section("Throughput (closed loop)", READ, parts=tuple(parts))]


def _restored(run: RunResult) -> list[Part]:
    """How a run with a disk tier restored its prompts, and the restores, where it made any."""
    rs = findings.restores(run.records)
    if not rs:
        return []
    tiers = run.meta.get("tiers") if isinstance(run.meta.get("tiers"), dict) else None
    slots = f"each connection kept to a slot of its own ({tiers.get('engine')}, slots " if tiers else ""
    if tiers:
        slots += ", ".join(str(s) for s in tiers.get("slots") or ()) + "); "
    text = (
        f"{run.label}: {slots}a prompt's first request was computed and its slot saved to a file; every later "
        "request of it had the file restored into its slot first (a real engine and real storage)."
    )
    if tiers and tiers.get("page_cache"):
        text += f" Page cache: {tiers['page_cache']}."
    return [Paragraph(text, "read"), *restore_parts(rs, tiers)]


FIGURES = ClosedLoopFigures()
