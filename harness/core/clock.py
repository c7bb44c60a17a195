"""The one model clock: where an arm's time line starts, and how wall-clock becomes model time.

Against the embedded emulator at time scale X, the emulator runs X times faster than the
hardware it models; every time kvbench records is then model time (wall-clock x X) and run.json
says so. Nothing else in the client converts between the two: workloads, scraper, traffic and
worker processes are all handed a ModelClock.
"""

from __future__ import annotations

import itertools
import math
import operator
import time
from dataclasses import dataclass, replace

from harness.core.errors import InputError

# The name of the request header that tells the embedded emulator when a request left (this
# host's monotonic ns), so that at a time scale X its modelled delays start from the send time.
SENT_HEADER = "X-Kvbench-Sent-Ns"

# The fastest time scale accepted: far beyond what any emulated test keeps (the shipped ones keep
# at most 50), and small enough that model times stay ordinary numbers.
MAX_TIME_SCALE = 1_000.0
# An asyncio timer wakes up to this late (epoll rounds to the millisecond): lateness within it is
# the loop's granularity, not an emulator that fell behind its model.
TIMER_GRANULARITY_S = 0.001
# What the embedded emulator adds to each response's usage: how late its first token was against
# its own model, beyond TIMER_GRANULARITY_S, in model seconds (judged per figure: analysis/stats.py).
EMULATOR_LATE_KEY = "kvbench_late_s"


def check_scale(x: float, where: str) -> float:
    """A time scale as given by a user: a finite number > 0, at most MAX_TIME_SCALE."""
    if not math.isfinite(x) or x <= 0 or x > MAX_TIME_SCALE:
        raise InputError(f"{where}: expected a number > 0 and at most {MAX_TIME_SCALE:,g}, got {x}")
    return x


@dataclass(frozen=True)
class ModelClock:
    scale: float = 1.0  # model seconds per wall-clock second
    t0_ns: int = 0  # the arm's start, time.perf_counter_ns()
    t0_mono: float = 0.0  # the same instant, time.monotonic() (scrapes, traffic timelines)

    def start(self) -> ModelClock:
        """This clock, started now."""
        return replace(self, t0_ns=time.perf_counter_ns(), t0_mono=time.monotonic())

    @property
    def modelled(self) -> bool:
        return self.scale != 1.0

    def since_start(self, t_ns: int) -> float:
        """Model seconds from the arm's start to a perf_counter_ns stamp."""
        return self.between(self.t0_ns, t_ns)

    def between(self, a_ns: int, b_ns: int) -> float:
        return round((b_ns - a_ns) / 1e9 * self.scale, 7)

    def gaps(self, stamps_ns: list[int]) -> list[float]:
        """Model seconds between successive stamps. Most are 0 (tokens that came in one read):
        only the others are converted, in plain Python (numpy's conversions cost more for a
        response's few hundred stamps)."""
        diffs = list(map(operator.sub, stamps_ns[1:], stamps_ns[:-1]))
        out = [0.0] * len(diffs)
        k = self.scale / 1e9
        for i in itertools.compress(range(len(diffs)), diffs):
            out[i] = round(diffs[i] * k, 7)
        return out

    def at_mono(self, t_mono: float) -> float:
        """Model seconds from the arm's start to a time.monotonic() reading."""
        return round((t_mono - self.t0_mono) * self.scale, 3)

    def model_s(self, wall_s: float) -> float:
        return wall_s * self.scale

    def wall_s(self, model_s: float) -> float:
        """How long to wait, wall-clock, for `model_s` of model time."""
        return model_s / self.scale

    def times_label(self) -> str:
        return "model time: wall-clock x time_scale" if self.modelled else "wall-clock"


# A Ray worker's clock is placed on the coordinator's time line only as well as its offset is
# known; beyond this uncertainty or drift (ns) its records' times are warned about.
CLOCK_WARN_NS = 1_000_000


@dataclass(frozen=True)
class Offset:
    """Another process's monotonic clock minus this one's, from round trips (sent, read there,
    received back): the shortest round trip bounds it best. The true offset lies within
    `uncertainty_ns` of `offset_ns` (half that round trip), whatever the path's asymmetry."""

    offset_ns: int
    uncertainty_ns: int
    samples: int

    @classmethod
    def estimate(cls, trips: list[tuple[int, int, int]]) -> Offset:
        sent, there, back = min(trips, key=lambda t: t[2] - t[0])
        return cls(there - (sent + back) // 2, (back - sent + 1) // 2, len(trips))

    def meta(self) -> dict[str, int]:
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns, "round_trips": self.samples}
