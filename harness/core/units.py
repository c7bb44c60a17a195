"""Sizes and bandwidths written by people ("200GB/s", "1MiB", "4k"), into bytes."""

from __future__ import annotations

import re

_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtTpP]?)(i?)([bB]?)\s*$")
_POW = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str, binary_default: bool = True) -> float:
    """'1M', '1MiB' -> 1048576 (binary, as fio reads them); '1MB' -> 1000000; '512' -> 512 bytes.
    Raises ValueError with what was expected."""
    m = _RE.match(text)
    if not m:
        raise ValueError(f'expected a size such as "1MiB", "4k" or "1GB", got {text!r}')
    value, prefix, i, b = m.groups()
    prefix = prefix.lower()
    binary = bool(i) or (binary_default and not b)
    return float(value) * (1024 if binary else 1000) ** _POW[prefix]


def parse_bandwidth(text: str) -> float:
    """'200GB/s' -> 2e11 bytes/s (decimal); '1.5GiB/s' -> binary; '50MB/s'; a bare number is bytes/s."""
    t = text.strip()
    if not t.endswith("/s"):
        if re.fullmatch(r"\d+(\.\d+)?", t):
            return float(t)
        raise ValueError(f'expected a bandwidth such as "200GB/s" or "50MiB/s", got {text!r}')
    return parse_size(t[:-2], binary_default=False)


def human_size(n: float) -> str:
    """Bytes in decimal units, three significant digits: '2.15 GB'."""
    for unit, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= f:
            return f"{n / f:.3g} {unit}"
    return f"{n:.3g} B"


def human_bandwidth(bps: float) -> str:
    return human_size(bps) + "/s"
