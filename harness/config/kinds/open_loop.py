"""`kind = "open_loop"`'s spec: its `[workload]` keys (one `rate` or a sweep of `rates`, the
arrival process, the warm-up, the capacity's narrowing, the pool's); workloads/open_loop.py
sends it, analysis/kinds/open_loop.py gives its figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self, cast

from harness.config.kinds import OPEN_LOOP_CONNECTIONS, KindSpec
from harness.config.kinds.pool import PoolConfig
from harness.config.tables import Table

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

ARRIVALS = ("constant", "poisson", "gamma")


@dataclass(frozen=True, kw_only=True)
class OpenLoopConfig(PoolConfig):
    kind: str = "open_loop"
    arrivals: Literal["constant", "poisson", "gamma"] = "poisson"
    gamma_shape: float = 1.0  # k: coefficient of variation 1/sqrt(k) (vLLM's --burstiness)
    rates: tuple[float, ...] = ()  # req/s, one result folder each (one `rate`: the arm's own folder)
    rates_auto: bool = False  # rates = "auto": probe, then spread rates up to saturation
    sweep_rates: bool = False  # written as `rates` (a folder per rate) rather than one `rate`
    requests: int = 0  # per rate, unless duration_s
    duration_s: float | None = None  # per rate, instead of `requests`
    warmup_requests: int = 0  # sent first at the same rate, recorded as phase "warmup", not counted
    warmup_shares_prefixes: bool = False  # the warm-up's prompts are the pool's (else leads of their own)
    max_concurrency: int | None = None
    seed: int | None = None  # the arrival times' seed (default: prompts.seed)
    auto_points: int = 5  # rates = "auto": rates between one-at-a-time and saturated throughput
    auto_concurrency: int = 64  # rates = "auto": connections of the saturated closed-loop probe
    # a sweep with an SLO: loads are added (capacity.narrowing) until the capacity's 95 % interval
    # is at most this share of the capacity, or capacity_loads more have been measured; None: the
    # rates as given only
    capacity_width: float | None = None
    capacity_loads: int = 6

    @classmethod
    def parse(cls, t: Table) -> Self:
        return cast(Self, _parse(cls, t))

    def connections(self) -> int:
        return self.max_concurrency or OPEN_LOOP_CONNECTIONS

    def most_connections(self) -> int:
        return self.max_concurrency or max(OPEN_LOOP_CONNECTIONS, self.auto_concurrency)

    def concurrency_cap(self) -> int | None:
        return self.max_concurrency

    def seed_of(self, sc: Scenario) -> int:
        """The arrival times' and picks' seed: the kind's own, else the scenario's prompts'."""
        return sc.prompts.seed if self.seed is None else self.seed

    def schedule_picks(self, seed: int, label: str, n: int) -> tuple[int, ...]:
        """Each request's prompt of the pool at the load labelled `label` (its result folder's
        suffix: `rate_label` for a rate), in schedule order."""
        return self.picks(f"{seed}/schedule/{label}", n)


def rate_label(rate: float) -> str:
    """A load's name at `rate` req/s (its result folder's suffix, its picks' stream)."""
    return f"r{rate:.4g}"


def _rate(t: Table, k: str, v: Any) -> float:
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        t.fail(k, "expected a rate in requests per second > 0 (finite)", v)
    return float(v)


def _parse(cls: type[OpenLoopConfig], t: Table) -> OpenLoopConfig:
    has_rate, has_rates = t.has("rate"), t.has("rates")
    if has_rate == has_rates:
        t.fail("", 'expected exactly one of rate = req/s, rates = [req/s, ...] or rates = "auto"', t.data)
    rates: tuple[float, ...] = ()
    auto = False
    if has_rate:
        rates = (_rate(t, "rate", t.get("rate")),)
    else:
        raw = t.get("rates")
        if raw == "auto":
            auto = True
        elif not isinstance(raw, list) or not raw:
            t.fail("rates", 'expected a non-empty list of rates in requests per second, or "auto"', raw)
        else:
            rates = tuple(sorted({_rate(t, f"rates[{i}]", v) for i, v in enumerate(raw)}))
    if t.has("requests") == t.has("duration_s"):
        t.fail("", "expected exactly one of requests (per rate) or duration_s (per rate)", t.data)
    arrivals = t.text("arrivals", cls.arrivals, ARRIVALS)
    shape = t.number("gamma_shape", cls.gamma_shape, positive=True)
    if t.has("gamma_shape") and arrivals != "gamma":
        t.fail("gamma_shape", 'applies to arrivals = "gamma" only', shape)
    max_conc = t.integer("max_concurrency", None, minimum=1, what="an integer number of requests in flight")
    w = cls(
        arrivals=arrivals,
        gamma_shape=shape,
        rates=rates,
        rates_auto=auto,
        sweep_rates=has_rates,
        requests=t.integer("requests", 0, minimum=1, what="an integer number of requests"),
        duration_s=t.number("duration_s", 0.0, positive=True) or None,
        warmup_requests=t.integer("warmup_requests", 0, minimum=0, what="an integer number of requests"),
        warmup_shares_prefixes=t.flag("warmup_shares_prefixes", cls.warmup_shares_prefixes),
        max_concurrency=max_conc,
        seed=t.integer("seed", None, minimum=0),
        auto_points=t.integer("auto_points", cls.auto_points, minimum=1, what="an integer number of rates"),
        auto_concurrency=t.integer(
            "auto_concurrency", cls.auto_concurrency, minimum=1, what="an integer number of connections"
        ),
        capacity_width=_share(t, "capacity_width"),
        capacity_loads=t.integer("capacity_loads", cls.capacity_loads, minimum=1, what="an integer number of loads"),
        **cls.pool_keys(t),
    )
    for k in ("auto_points", "auto_concurrency"):
        if t.has(k) and not auto:
            t.fail(k, 'applies to rates = "auto" only', t.data[k])
    for k in ("capacity_width", "capacity_loads"):
        if t.has(k) and not has_rates:
            t.fail(k, 'applies to a sweep (rates = [...] or "auto") only', t.data[k])
    if t.has("capacity_loads") and not t.has("capacity_width"):
        t.fail("capacity_loads", "applies with capacity_width only", t.data["capacity_loads"])
    return w


def _share(t: Table, k: str) -> float | None:
    v = t.get(k)
    if v is None:
        return None
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= 1:
        t.fail(k, "expected the interval's width as a share of the capacity, > 0 and at most 1 (0.1: 10 %)", v)
    return float(v)


SPEC = KindSpec(
    name="open_loop",
    config=OpenLoopConfig,
    figures="harness.analysis.kinds.open_loop:FIGURES",
    driver="harness.workloads.open_loop:DRIVER",
)
