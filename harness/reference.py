"""The published figures (IBM Redbooks MD260021), from the project's own copy of
`shared/reference/redbooks-md260021.toml`. Everything calibrated to the paper reads them here."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any


@cache
def redbooks() -> dict[str, Any]:
    text = resources.files("harness").joinpath("reference/redbooks-md260021.toml").read_text("utf-8")
    return tomllib.loads(text)
