"""Values a workload draws per use (seeded): prompt lengths (`Distribution`: a number of tokens
or a table such as {distribution = "uniform", min, max}) and times (`Seconds`), their TOML forms
and their draws. Pure."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from harness.config.tables import Table
from harness.core.errors import InputError


@dataclass(frozen=True)
class Distribution:
    """A prompt length: fixed, or drawn (seeded) per pooled prompt."""

    kind: Literal["fixed", "uniform", "normal"]
    value: int = 0
    min: int = 0
    max: int = 0
    mean: float = 0.0
    stddev: float = 0.0


@dataclass(frozen=True)
class Seconds:
    """A time drawn per use (seeded): fixed, uniform between min and max, or exponential of a
    mean (a session's think time between turns)."""

    kind: Literal["fixed", "uniform", "exponential"]
    value: float = 0.0
    min: float = 0.0
    max: float = 0.0
    mean: float = 0.0


def distribution(t: Table, k: str, unit: str = "tokens") -> Distribution:
    v = t.get(k)
    what = f'an integer number of {unit} or a table {{distribution = "uniform"|"normal", ...}}'
    if v is None:
        raise InputError(f"{t.file}: {t.key(k)}: missing; expected {what}")
    if isinstance(v, int) and not isinstance(v, bool):
        return Distribution("fixed", value=t.check_int(k, v, 1, f"an integer number of {unit}"))
    if not isinstance(v, dict):
        t.fail(k, f"expected {what}", v)
    d = Table(t.file, t.key(k), v)
    kind = d.text("distribution", None, ("uniform", "normal"), required=True)
    if kind == "uniform":
        lo = d.integer("min", required=True, minimum=1, what=f"an integer number of {unit}")
        hi = d.integer("max", required=True, minimum=lo, what=f"an integer number of {unit}")
        dist = Distribution("uniform", min=lo, max=hi)
    else:
        mean = d.number("mean", 0.0, positive=True)
        dist = Distribution(
            "normal",
            mean=mean,
            stddev=d.number("stddev", 0.0, minimum=0.0),
            min=d.integer("min", 1, minimum=1, what=f"an integer number of {unit}"),
            max=d.integer("max", 131072, minimum=1, what=f"an integer number of {unit}"),
        )
    d.done()
    return dist


def seconds(t: Table, k: str) -> Seconds:
    v = t.get(k)
    what = 'seconds >= 0, or a table {distribution = "uniform", min, max} or {distribution = "exponential", mean}'
    if v is None:
        raise InputError(f"{t.file}: {t.key(k)}: missing; expected {what}")
    if isinstance(v, int | float) and not isinstance(v, bool):
        if not math.isfinite(v) or v < 0:
            t.fail(k, "expected a number of seconds >= 0", v)
        return Seconds("fixed", value=float(v))
    if not isinstance(v, dict):
        t.fail(k, f"expected {what}", v)
    d = Table(t.file, t.key(k), v)
    kind = d.text("distribution", None, ("uniform", "exponential"), required=True)
    if kind == "uniform":
        lo = d.number("min", 0.0, minimum=0.0)
        out = Seconds("uniform", min=lo, max=d.number("max", lo, minimum=lo))
    else:
        out = Seconds("exponential", mean=d.number("mean", 0.0, positive=True))
    d.done()
    return out


def draw_length(d: Distribution, rng: random.Random) -> int:
    if d.kind == "fixed":
        return d.value
    if d.kind == "uniform":
        return rng.randint(d.min, d.max)
    return max(d.min, min(d.max, round(rng.gauss(d.mean, d.stddev))))


def draw_seconds(d: Seconds, rng: random.Random) -> float:
    if d.kind == "fixed":
        return d.value
    if d.kind == "uniform":
        return rng.uniform(d.min, d.max)
    return rng.expovariate(1.0 / d.mean)


def longest(d: Distribution) -> int:
    return d.value if d.kind == "fixed" else d.max


def smallest(d: Distribution) -> int:
    return d.value if d.kind == "fixed" else d.min
