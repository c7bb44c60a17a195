"""A `kvbench size` result folder read back (sizing.json): found, read bounded and checked, and the
figures `kvbench gate` checks of each configuration (pure apart from reading the file)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from harness.config.scenario import TIER_NAMES
from harness.core.errors import InputError, read_input
from harness.core.units import human_bandwidth, human_size
from harness.sizing.simulate import MAX_BINS

SIZING = "sizing.json"
# A row per request of each configuration (commands/size.py writes it; sizing.json's
# `requests_file` names it when it was written); a line of it is some 200 bytes
REQUESTS = "requests.csv.gz"
REQUEST_LINE_MAX = 64 << 10
# The same bound as a run's run.json (results.RESULT_JSON_MAX_BYTES)
SIZING_MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class Sizing:
    """A sizing result folder as read back."""

    folder: Path
    doc: dict[str, Any]


def folders(path: Path) -> list[Path]:
    """A sizing result folder, or a folder of them (the newest, by name: they are named by their
    time), or a results root (the newest of each sizing); [] when there is none."""
    if (path / SIZING).is_file():
        return [path]
    below = sorted(p.parent for p in path.glob(f"*/{SIZING}"))
    if below:
        return [below[-1]]
    return [f for name in sorted({p.parent.parent for p in path.glob(f"*/*/{SIZING}")}) for f in folders(name)]


def of(paths: list[Path], command: str) -> list[Path] | None:
    """The sizing result folders of `paths` (each as `folders` finds them) when they are sizing
    results, None when none is; a mix of sizing and run results is refused (`command`'s name in
    the message)."""
    sized = {p: folders(p) for p in paths if p.exists()}
    if not any(sized.values()):
        return None
    if not all(sized.get(p) for p in paths):
        raise InputError(
            f"give `{command}` sizing results or run results, not both: "
            + ", ".join(str(p) for p in paths if not sized.get(p))
            + f" holds no {SIZING}"
        )
    return [f for p in paths for f in sized[p]]


def read(folder: Path) -> Sizing:
    text = read_input(folder / SIZING, "sizing result", SIZING_MAX_BYTES)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise InputError(f"{folder / SIZING}: unreadable: not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != "sizing" or not isinstance(doc.get("configurations"), list):
        raise InputError(f"{folder / SIZING}: not a sizing result kvbench wrote (kind, configurations)")
    return Sizing(folder, doc)


# What `kvbench gate` checks of each configuration of a sizing result, one value each (aggregate
# `value`); `sized_` says they are simulated. Per tier: `sized_g1_share` ... `sized_g4_share` (the
# share of prompt tokens it serves), `sized_g1_read_p99` ... and `sized_g1_write_p99` ... (bytes/s).
TIER_METRICS = tuple(f"sized_{t.lower()}_{what}" for t in TIER_NAMES for what in ("share", "read_p99", "write_p99"))
# A tier's read and write bandwidth figures (bytes/s): the mean over the time it was read or
# written, and the p50, p99 and max of its bins (a sizing.json from before p50 has none: None)
BANDWIDTH_FIGURES = ("mean", "p50", "p99", "max")
METRICS = (
    "sized_ttft_p50_s",
    "sized_ttft_p99_s",
    *TIER_METRICS,
    "sized_prefill_saved_share",
    "sized_slo_within",
    "sized_slo_capacity_ratio",
)


def label(swept: dict[str, Any]) -> str:
    """A configuration as the gate names it (its `arm`): its swept values, with no space, comma or
    equals sign, so that a rule's `{arm=...}` can pick it; "sizing" when nothing was swept."""
    parts = [f"{k}:{value(k, v)}".replace(" ", "") for k, v in swept.items()]
    return ";".join(parts) or "sizing"


def gate_values(s: Sizing) -> dict[str, dict[str, float]]:
    """Each configuration's figures by its label, as METRICS names them (a figure it does not
    have, such as the SLO's without an SLO, is absent: the gate says missing)."""
    out: dict[str, dict[str, float]] = {}
    try:
        for c in s.doc["configurations"]:
            f = c["figures"]
            got: dict[str, float] = {"sized_ttft_p50_s": f["ttft_s"]["p50"], "sized_ttft_p99_s": f["ttft_s"]["p99"]}
            for t in f["tiers"]:
                got[f"sized_{str(t['name']).lower()}_share"] = t["share"]
                got[f"sized_{str(t['name']).lower()}_read_p99"] = t["read_bytes_per_s"]["p99"]
                if "write_bytes_per_s" in t:  # (a sizing.json written before writes were reckoned has none)
                    got[f"sized_{str(t['name']).lower()}_write_p99"] = t["write_bytes_per_s"]["p99"]
            if f["recompute_prefill_gpu_s"]:
                got["sized_prefill_saved_share"] = 1 - f["prefill_gpu_s"] / f["recompute_prefill_gpu_s"]
            if (slo := f["slo"]) is not None:
                got["sized_slo_within"] = slo["cached"]["within"]
                if slo["capacity_ratio"] is not None:
                    got["sized_slo_capacity_ratio"] = slo["capacity_ratio"]
            out[label(c["swept"])] = {k: float(v) for k, v in got.items() if v is not None}
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{s.folder / SIZING}: a field is missing or not what kvbench writes ({e!r})") from None
    return out


def rows(s: Sizing) -> list[dict[str, Any]]:
    """Each configuration of a sizing result as `row` makes it."""
    try:
        return [row(c) for c in s.doc["configurations"]]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"{s.folder / SIZING}: a field is missing or not what kvbench writes ({e!r})") from None


def row(c: dict[str, Any]) -> dict[str, Any]:
    """A configuration as one row (configurations.csv, `kvbench export --table configurations`):
    its values (bytes, bytes/s) and figures."""
    f = c["figures"]
    row: dict[str, Any] = {"workers": c["workers"]}
    for t, got in zip(c["tiers"], f["tiers"], strict=True):
        n = t["name"]
        bw = got["read_bytes_per_s"]
        row |= {
            f"{n}_capacity_bytes": t["capacity_bytes"],
            f"{n}_read_bandwidth": t["read_bandwidth"],
            f"{n}_share": got["share"],
            **{f"{n}_read_{q}": bw.get(q) for q in BANDWIDTH_FIGURES},
            f"{n}_written_tokens": got.get("written_tokens"),
            **{f"{n}_write_{q}": (got.get("write_bytes_per_s") or {}).get(q) for q in BANDWIDTH_FIGURES},
            f"{n}_knee_bytes": knee_bytes(t, got),
        }
    for k in ("ttft_s", "recompute_ttft_s"):
        row |= {f"{k}_{q}": f[k][q] for q in ("p50", "p90", "p99")}
    row |= {k: f[k] for k in ("prefill_gpu_s", "recompute_prefill_gpu_s", "computed_tokens")}
    if (slo := f["slo"]) is not None:
        row |= {
            "slo_within": slo["cached"]["within"],
            "slo_within_recompute": slo["recompute"]["within"],
            "slo_capacity_speedup": slo["cached"]["capacity_speedup"],
            "slo_capacity_speedup_recompute": slo["recompute"]["capacity_speedup"],
            "slo_capacity_ratio": slo["capacity_ratio"],
        }
    return row


def knee_bytes(tier: dict[str, Any], got: dict[str, Any]) -> float | None:
    """Where a tier's own share stops growing for good, in bytes of each instance (None: past the
    curve's 16x)."""
    knee = got["curve"]["knee_blocks"]
    if knee is None or not tier["capacity_blocks"]:
        return None
    return float(knee * tier["capacity_bytes"] / tier["capacity_blocks"])


def value(key: str, v: Any) -> str:
    """A swept value as people write it."""
    if key.endswith("read_bandwidth"):
        return "free" if v is None else human_bandwidth(float(v))
    if key.endswith("capacity"):
        return human_size(float(v or 0))
    return "-" if v is None else f"{v:g}"


class BoundedLines:
    """A text stream read for a parser (pandas' `read_csv`) that fails, instead of growing
    without end, once a line passes `limit` characters: a damaged or hostile requests file that
    decompresses to one endless line."""

    def __init__(self, f: IO[str], limit: int) -> None:
        self.f, self.limit, self.run = f, limit, 0

    def read(self, n: int = -1) -> str:
        data = self.f.read(n if n > 0 else 1 << 16)
        pieces = data.split("\n")  # the first goes on with the line read so far; each other is a line's start
        if self.run + len(pieces[0]) > self.limit or any(len(p) > self.limit for p in pieces[1:]):
            raise ValueError(f"a line longer than {self.limit:,} characters")
        self.run = self.run + len(pieces[0]) if len(pieces) == 1 else len(pieces[-1])
        return data


def warnings(doc: dict[str, Any]) -> list[str]:
    """What the terminal and the report warn of in a sizing: arrivals that did not settle, and
    bandwidths averaged over bins wider than `bandwidth_bin_s` asked for."""
    return unsettled(doc["configurations"]) + coarse_bins(doc)


def coarse_bins(doc: dict[str, Any]) -> list[str]:
    """A line for each configuration whose bandwidths are averaged over wider bins than the file
    asked for: its simulation spanned more than simulate.MAX_BINS of them (`bin_for`). (A
    sizing.json written before either was recorded has none.)"""
    asked = doc.get("bandwidth_bin_s")
    out = []
    for c in doc["configurations"]:
        used = c["figures"].get("bandwidth_bin_s")
        if asked is not None and used is not None and used > asked:
            out.append(
                f"configuration {c['index']}: its bandwidths' p99 and max are over bins of {used:.3g} s, not the "
                f"{asked:.3g} s bandwidth_bin_s asks for: its simulation ran for more than {asked * MAX_BINS:.3g} s, "
                f"and at most {MAX_BINS:,} bins are kept"
            )
    return out


def unsettled(configurations: list[dict[str, Any]]) -> list[str]:
    """A line for each configuration of a kind's plan whose arrivals did not settle (sizing.json's
    `arrivals`, and its SLO search's `unsettled_speedups`: sizing/planned.py)."""
    out = []
    for c in configurations:
        for way, s in (c["figures"].get("arrivals") or {}).items():
            if not s["settled"]:
                out.append(
                    f"configuration {c['index']} ({way}): the arrivals still moved by {s['last_change_s']:.3g} s after "
                    f"{s['passes']} passes; its figures are those of the last pass"
                )
        for way, s in (c["figures"].get("slo") or {}).items():
            if isinstance(s, dict) and s.get("unsettled_speedups"):
                tried = ", ".join(f"{x:.3g}x" for x in s["unsettled_speedups"])
                out.append(
                    f"configuration {c['index']} ({way}): the SLO search's arrivals did not settle at {tried}; the "
                    "answers there are those of the last pass"
                )
    return out
