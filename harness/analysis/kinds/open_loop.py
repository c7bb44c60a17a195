"""`kind = "open_loop"`'s figures: the steady throughput, TPOT, the schedule's lag, how saturated
the server was, and goodput under the SLO (also for the gate); its report section: latency,
goodput and SLO capacity against offered load, per arm, and the tier's benefit as capacity."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from harness.analysis import capacity, stats, wording
from harness.analysis.kinds import Demand, Figures, GateFigures, Parts, pool_demand
from harness.analysis.kinds.document import Cell, Flag, Heading, Line, Lines, Mark, Paragraph, Part, Section, Table
from harness.analysis.wording import num
from harness.config.kinds import schedule
from harness.config.kinds.open_loop import OpenLoopConfig, rate_label
from harness.core.errors import InputError
from harness.results import RequestRecord, RunResult

if TYPE_CHECKING:
    from harness.config.scenario import Scenario


class OpenLoopFigures(Figures):
    def figures(self, records: stats.Records, counted: stats.Records, slo: dict[str, float] | None) -> dict[str, Any]:
        t = stats.throughput(counted)
        out: dict[str, Any] = {
            "steady_req_per_s": t.steady_req_per_s,
            "tpot_s": stats.describe(stats.values(stats.ok(counted), "tpot_s")),
            "warmup_requests": len(records) - len(counted),
            "mean_in_flight": t.mean_concurrency,
            "saturation": stats.saturation(counted),
        }
        if slo:
            out["slo"] = stats.goodput(counted, slo)
        out["schedule_lag"] = stats.schedule_lag(counted)
        return out

    def lines(self, s: dict[str, Any]) -> list[str]:
        lag, tpot, fmt = s["schedule_lag"], s["tpot_s"], wording.fmt
        line = f"TPOT p50 {fmt(tpot['p50'], 4)} s, p99 {fmt(tpot['p99'], 4)} s"
        if lag["requests"]:
            line += f"; {wording.sent(lag)}"
        if (slo := s.get("slo")) is not None:
            line += f"; SLO met by {slo['met']}/{slo['requests']}, goodput {fmt(slo['goodput_req_per_s'], 3)} req/s"
        if (s.get("saturation") or {}).get("saturated"):
            line += "; saturated"
        lines = [line]
        if (steady := s.get("steady_req_per_s")) is not None:  # two req/s of one load: say which is which
            lines.append(
                f"steady state {fmt(steady, 3)} req/s, between ramp-up and drain (the headline's "
                f"{fmt(s['req_per_s'], 3)} req/s is over the whole run, both ends in)"
            )
        return lines

    def gate_figures(self, run: RunResult) -> GateFigures:
        """Goodput and the share meeting the SLO, beside the throughput."""
        out: GateFigures = {}
        if (slo := capacity.slo_of(run)) is not None:
            g = stats.goodput(run.records, slo[0])
            for name in ("goodput_req_per_s", "share_met"):
                if g[name] is not None:
                    out[("slo_share_met" if name == "share_met" else name, None)] = float(g[name])
        return {**out, **super().gate_figures(run)}

    def prompt_parts(self, run: RunResult, record: RequestRecord) -> Parts:
        """A warm-up request's prompt is its own (workloads/open_loop.py gives it a lead of its
        own), unless the warm-up shares the pool's prefixes."""
        parts = super().prompt_parts(run, record)
        if record.phase != "warmup" or (run.scenario.get("workload") or {}).get("warmup_shares_prefixes"):
            return parts
        return tuple((f"warm-up {name}", n) for name, n in parts)

    def demand(self, sc: Scenario) -> Demand:
        """The measured requests at the workload's first rate, sent at their drawn times (from the
        first), at most `max_concurrency` at a time; the warm-up is left out (a measurement's
        device: it only warms the server's cache before the measured part)."""
        w = sc.workload
        assert isinstance(w, OpenLoopConfig)
        if w.rates_auto:
            raise InputError(
                f'{sc.path}: workload.rates: "auto" finds its rates by probing a live server; expected the rates '
                "(requests per second) to size its plan at"
            )
        rate, seed, warm = w.rates[0], w.seed_of(sc), w.warmup_requests
        times = schedule.send_times(w, rate, seed)
        picks = w.schedule_picks(seed, rate_label(rate), len(times))
        notes = [f"the first of its {len(w.rates)} rates, {rate:g} req/s"] if len(w.rates) > 1 else []
        notes += [f"its {warm} warm-up requests left out"] if warm else []
        measured = times[warm:] - (times[warm] if len(times) > warm else 0.0)
        return pool_demand(sc, w, picks[warm:], tuple(float(t) for t in measured), w.max_concurrency, "; ".join(notes))

    def sections(self, runs: list[RunResult]) -> list[Section]:
        """Per arm its loads (latency, goodput, schedule lag), saturation and SLO capacity, curves
        against offered load, and the tier's benefit as capacity."""
        arms = capacity.curves(runs)
        if not arms:
            return []
        benefits = (capacity.sentence(b) for b in capacity.benefit(arms))
        parts: list[Part] = [Paragraph(b[0].upper() + b[1:], "finding") for b in benefits]
        parts += _against_load(arms)
        for a in arms:
            parts += [Heading(a.arm), Paragraph(_arm_text(a)), Table(COLUMNS, tuple(_row(p) for p in a.points))]
        return [Section("Open loop: latency, goodput and SLO capacity against offered load", READ, parts=tuple(parts))]


READ = (
    "How to read this: each point is one rate of arrivals (the serial probe is placed at the rate one request at "
    'a time achieved). Goodput counts only requests that met every SLO limit, per second; "share met" is their '
    "share of the measured requests (warm-up left out), with its 95 % Wilson interval. A rate is saturated when "
    "TTFT and the requests in flight grew through the run. SLO capacity is where the share met, interpolated "
    "between the two rates around it, crosses the required share; its interval comes from the share intervals at "
    "those two rates and stays between them. Solid vertical lines: SLO capacity; dashed: the first saturated "
    "rate. Schedule lag: real send time minus intended; when it is large the offered load was not what the rate "
    "says. Arrivals: the process the scenario asked for; the coefficient of variation of the gaps between the "
    "real send times is set beside the process's (0 constant, 1 Poisson, 1/√k gamma), and for Poisson and "
    "gamma the p-value of a Kolmogorov-Smirnov test of those gaps against the process at the offered rate (a "
    "small p: the sends did not follow it)."
)
COLUMNS = (
    "load",
    "offered req/s",
    "completed req/s",
    "requests",
    "TTFT p50 / p99 (s)",
    "TPOT p50 / p99 (s)",
    "share met (95 % interval)",
    "goodput req/s",
    "schedule lag p99 (ms)",
    "held back",
    "saturated",
    "arrivals",
    "gap CV (expected)",
    "KS p",
)


def _against_load(arms: list[capacity.ArmCurve]) -> list[Part]:
    """TTFT, and goodput with all completions, against offered load: a curve per arm and figure,
    its SLO capacity and first saturated rate marked."""
    ttft: list[Line] = []
    good: list[Line] = []
    ttft_marks: list[Mark] = []
    good_marks: list[Mark] = []
    for i, a in enumerate(arms):
        x = tuple(p.offered_req_per_s for p in a.points)
        cap = a.capacity.req_per_s if a.capacity.bound in ("measured", "saturation") else None
        marks = [Mark(cap, style=i)] if cap else []
        marks += [Mark(a.saturation_rate, style=i, line="dashed")] if a.saturation_rate else []
        ttft.append(Line(f"{a.arm} TTFT p50", x, tuple(p.ttft_p50_s for p in a.points), i))
        ttft.append(Line(f"{a.arm} TTFT p99", x, tuple(p.ttft_p99_s for p in a.points), i, dotted=True))
        ttft_marks += marks
        if any(p.goodput_req_per_s is not None for p in a.points):
            good.append(Line(f"{a.arm} goodput", x, tuple(p.goodput_req_per_s for p in a.points), i))
            good_marks += marks
        good.append(Line(f"{a.arm} completed", x, tuple(p.achieved_req_per_s for p in a.points), i, dotted=True))
    x_label = "offered load (requests / s, log scale)"  # arms with and without a tier differ by tens of times
    return [
        Lines(
            "TTFT p50 (solid) and p99 (dotted) against offered load.",
            x_label,
            "TTFT (s)",
            tuple(ttft),
            tuple(ttft_marks),
            logx=True,
            logy=True,
        ),
        Lines(
            "Goodput (solid) and all completed requests per second (dotted) against offered load.",
            x_label,
            "requests / s",
            tuple(good),
            tuple(good_marks),
            logx=True,
        ),
    ]


def _arm_text(a: capacity.ArmCurve) -> str:
    """An arm's capacity, where it first saturated, and its saturated throughput, in words."""
    text = f"{capacity.capacity_text(asdict(a.capacity))}. " if a.capacity.bound != "no_slo" else ""
    if a.saturation_rate:
        text += f"First saturated at {num(a.saturation_rate)} req/s"
        if a.saturated:
            text += (
                " (TTFT and requests in flight rose through that run; the saturated probe, not this verdict, "
                "bounds the capacity)"
            )
        text += ". "
    if s := a.saturated:
        interval = f"95 % interval {num(s.low)} to {num(s.high)}, " if s.low is not None else ""
        text += f"Saturated closed-loop throughput: {num(s.req_per_s)} req/s ({interval}{s.requests} requests)."
    return text.strip()


def _row(p: capacity.Point) -> tuple[Cell, ...]:
    met = (
        f"{p.share_met * 100:.0f} % ({(p.share_lo or 0) * 100:.0f} to {(p.share_hi or 0) * 100:.0f} %)"
        if p.share_met is not None
        else "-"
    )
    saturated: Cell = Flag("yes") if p.saturated else ("-" if p.saturated is None else "no")
    return (
        p.mode,
        p.offered_req_per_s,
        p.achieved_req_per_s,
        p.requests,
        f"{num(p.ttft_p50_s)} / {num(p.ttft_p99_s)}",
        f"{num(p.tpot_p50_s, 4)} / {num(p.tpot_p99_s, 4)}",
        met,
        p.goodput_req_per_s,
        None if p.lag_p99_s is None else p.lag_p99_s * 1000,
        Flag(str(p.held_back)) if p.held_back else 0,
        saturated,
        p.arrivals or "-",
        f"{num(p.gaps_cv)} ({num(p.expected_cv)})" if p.gaps_cv is not None else "-",
        p.ks_p,
    )


FIGURES = OpenLoopFigures()
