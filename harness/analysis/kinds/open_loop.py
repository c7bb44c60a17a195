"""`kind = "open_loop"`'s figures: the steady throughput, TPOT, the schedule's lag, how saturated
the server was, and goodput under the SLO (also for the gate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.analysis import capacity, stats, wording
from harness.analysis.kinds import Demand, Figures, GateFigures, Parts, pool_demand
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


FIGURES = OpenLoopFigures()
