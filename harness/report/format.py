"""How numbers read in reports and tables: one formatter for the report, `compare` and the CLI."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def num(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, int | np.integer):
        return f"{int(x):,}"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"
