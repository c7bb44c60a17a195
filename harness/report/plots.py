"""Figures as inline SVG (matplotlib, text drawn as paths: no fonts to fetch). Each series
differs by marker and line style as well as colour, so the plots read without colour."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

# Colour-blind-safe (Okabe-Ito), each paired with its own marker and dash pattern.
STYLES: list[dict[str, Any]] = [
    {"color": "#0072B2", "marker": "o", "linestyle": "-"},
    {"color": "#D55E00", "marker": "s", "linestyle": "--"},
    {"color": "#009E73", "marker": "^", "linestyle": "-."},
    {"color": "#CC79A7", "marker": "D", "linestyle": ":"},
    {"color": "#E69F00", "marker": "v", "linestyle": (0, (5, 1, 1, 1))},
    {"color": "#56B4E9", "marker": "P", "linestyle": (0, (1, 1))},
]
PUBLISHED: dict[str, Any] = {"color": "black", "marker": "X", "linestyle": "none", "markersize": 10}
DENSE = 2000  # above this many drawn elements a layer is rasterized to keep the file small


def shown(text: str) -> str:
    """Text from result files as a plot may show it: printable ASCII (the plots' font has no other
    glyphs for certain; the report's tables show the text whole), no mathtext (a "$" would be
    parsed as TeX)."""
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text).replace("$", r"\$")


def style(i: int) -> dict[str, Any]:
    return STYLES[i % len(STYLES)]


def _fig(name: str, w: float = 7.5, h: float = 4.2) -> Figure:
    """A figure outside pyplot's registry: nothing to close, so a plot that fails halfway (odd
    data) leaves nothing open behind it."""
    matplotlib.rcParams.update({"svg.fonttype": "path", "svg.hashsalt": name, "font.size": 10})
    return Figure(figsize=(w, h), dpi=100)


def to_svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.tight_layout()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    fig.clear()  # the figure's reference cycles would keep its data until a garbage collection
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def ttft_vs_length(series: Sequence[dict[str, Any]], published: Sequence[dict[str, Any]]) -> str:
    """series: {label, lengths, p50, lo, hi}; published: {label, length, value}."""
    fig = _fig("ttft")
    ax = fig.add_subplot()
    for i, s in enumerate(series):
        st = style(i)
        yerr = None
        if s.get("lo") is not None:
            yerr = np.abs(np.array([s["lo"], s["hi"]], dtype=float) - np.array(s["p50"], dtype=float))
        ax.errorbar(s["lengths"], s["p50"], yerr=yerr, label=s["label"], capsize=3, **st)
    for j, p in enumerate(published):
        ax.plot([p["length"]], [p["value"]], label="published" if j == 0 else None, **PUBLISHED)
        ax.annotate(
            f"{p['label']} {p['value']:g} s",
            (p["length"], p["value"]),
            textcoords="offset points",
            xytext=(6, -12 if "warm" in p["label"] else 6),
            fontsize=8,
        )
    ax.set_yscale("log")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("TTFT, median (s, log scale)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return to_svg(fig)


def speedup_vs_length(
    lengths: Sequence[int],
    speedup: Sequence[float | None],
    lo: Sequence[float | None],
    hi: Sequence[float | None],
    published: Sequence[tuple[int, float]],
) -> str:
    fig = _fig("speedup")
    ax = fig.add_subplot()
    x = np.array(lengths, dtype=float)
    y = np.array([np.nan if v is None else v for v in speedup], dtype=float)
    ax.plot(x, y, label="measured (cold / warm median)", **style(0))
    if all(v is not None for v in lo):
        ax.fill_between(
            x,
            np.array(lo, dtype=float),
            np.array(hi, dtype=float),
            alpha=0.2,
            color=style(0)["color"],
            label="95 % interval",
        )
    for j, (n, v) in enumerate(published):
        ax.plot([n], [v], label="published" if j == 0 else None, **PUBLISHED)
        ax.annotate(f"{v:g}x", (n, v), textcoords="offset points", xytext=(6, 6), fontsize=8)
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("speedup (x)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return to_svg(fig)


def bars(
    labels: Sequence[str], measured: Sequence[float | None], published: Sequence[float | None], ylabel: str
) -> str:
    fig = _fig("bars", h=3.8)
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    m = [0.0 if v is None else v for v in measured]
    p = [0.0 if v is None else v for v in published]
    ax.bar(x - 0.2, m, 0.4, label="measured", color=style(0)["color"], edgecolor="black")
    ax.bar(x + 0.2, p, 0.4, label="published", color="white", edgecolor="black", hatch="//")
    for xi, v in zip(x, measured, strict=True):
        ax.annotate("-" if v is None else f"{v:.3g}", (xi - 0.2, v or 0), ha="center", va="bottom", fontsize=8)
    for xi, v in zip(x, published, strict=True):
        ax.annotate("-" if v is None else f"{v:.3g}", (xi + 0.2, v or 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [shown(label).replace("/", "/\n") for label in labels], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    return to_svg(fig)


# An empirical CDF is drawn through at most this many quantiles
CDF_POINTS = 500


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """What `cdfs` draws of a sample: its quantiles at CDF_POINTS shares, those shares, and its
    size (taken at once, so that a run's 10^7 values need not be held until the plot)."""
    q = np.linspace(0, 1, min(len(values), CDF_POINTS))
    return (np.quantile(values, q) if len(values) else q), q, len(values)


def cdfs(series: Sequence[tuple[str, tuple[np.ndarray, np.ndarray, int]]], xlabel: str, name: str) -> str:
    """Empirical CDFs, each drawn through its cdf_points."""
    fig = _fig(name, h=3.8)
    ax = fig.add_subplot()
    for i, (label, (x, q, n)) in enumerate(series):
        if n == 0:
            continue
        st = dict(style(i))
        st.pop("marker")
        ax.plot(x, q, label=f"{shown(label)} (n={n})", **st)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_svg(fig)


def timeline(
    groups: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
    traffic: tuple[np.ndarray, np.ndarray] | None = None,
) -> str:
    """groups: (label, start, first token, end) per request, in seconds. Thin line: waiting for the
    first token; thick line: streaming the answer."""
    from matplotlib.collections import LineCollection

    fig = _fig("timeline", h=4.6)
    ax = fig.add_subplot()
    row = 0
    total = sum(len(g[1]) for g in groups)
    for i, (label, start, ft, end) in enumerate(groups):
        st = style(i)
        rows = np.arange(row, row + len(start))
        ft = np.where(np.isnan(ft), end, ft)
        wait = LineCollection(
            [[(s, r), (f, r)] for s, f, r in zip(start, ft, rows, strict=True)],
            linewidths=0.6,
            colors=st["color"],
            linestyles=st["linestyle"],
            alpha=0.6,
            label=f"{shown(label)}: waiting",
        )
        stream = LineCollection(
            [[(f, r), (e, r)] for f, e, r in zip(ft, end, rows, strict=True)],
            linewidths=2.2,
            colors=st["color"],
            label=f"{shown(label)}: streaming",
        )
        for coll in (wait, stream):
            coll.set_rasterized(total > DENSE)
            ax.add_collection(coll)
        row += len(start)
    ax.autoscale()
    ax.set_xlabel("time since the run's start (s)")
    ax.set_ylabel("request")
    if traffic is not None:
        ax2 = ax.twinx()
        ax2.plot(traffic[0], traffic[1], color="black", linestyle="--", label="competing I/O (GB/s)")
        ax2.set_ylabel("competing I/O (GB/s)")
        ax2.legend(loc="lower right", fontsize=8)
    ax.legend(loc="upper left", fontsize=8)
    return to_svg(fig)


def cost_fit(
    cold: tuple[np.ndarray, np.ndarray],
    warm: tuple[np.ndarray, np.ndarray],
    a: float,
    b: float,
    c: float,
    s: float,
    break_even: float | None,
) -> str:
    fig = _fig("costfit")
    ax = fig.add_subplot()
    n_max = max(float(np.max(cold[0])), float(np.max(warm[0])))
    n = np.linspace(0, n_max * 1.05, 200)
    ax.plot(
        cold[0],
        cold[1],
        linestyle="none",
        label="cold (measured)",
        **{k: v for k, v in style(1).items() if k != "linestyle"},
    )
    ax.plot(
        warm[0],
        warm[1],
        linestyle="none",
        label="warm (measured)",
        **{k: v for k, v in style(0).items() if k != "linestyle"},
    )
    ax.plot(n, a * n + b * n * n, color=style(1)["color"], linestyle="--", label="recompute fit a*n + b*n^2")
    ax.plot(n, c + s * n, color=style(0)["color"], linestyle="-", label="load fit c + n/r")
    if break_even is not None and 0 < break_even < n_max * 1.05:
        ax.axvline(break_even, color="black", linestyle=":", label=f"break-even {break_even:,.0f} tokens")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT (s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return to_svg(fig)


def against_load(series: Sequence[dict[str, Any]], ylabel: str, name: str, log: bool = False) -> str:
    """Open loops: one curve per (arm, figure) against offered load. series: {label, x, y,
    style (index), dashed, capacity (x of a vertical mark, or None), saturation (x or None)}."""
    fig = _fig(name, h=3.8)
    ax = fig.add_subplot()
    for s in series:
        st = dict(style(s["style"]))
        if s.get("dashed"):
            st["linestyle"] = ":"
        x = np.asarray(s["x"], dtype=float)
        y = np.asarray([np.nan if v is None else v for v in s["y"]], dtype=float)
        ax.plot(x, y, label=shown(s["label"]), **st)
        if s.get("capacity"):
            ax.axvline(s["capacity"], color=st["color"], linestyle="-", alpha=0.5, linewidth=2)
        if s.get("saturation"):
            ax.axvline(s["saturation"], color=st["color"], linestyle="--", alpha=0.5)
    ax.set_xscale("log")  # arms with and without a tier differ by tens of times
    return _labelled(fig, ax, "offered load (requests / s, log scale)", ylabel, log)


def scatter(series: Sequence[dict[str, Any]], xlabel: str, ylabel: str, name: str, logy: bool = False) -> str:
    """Points per series: {label, x, y, style (index)}."""
    fig = _fig(name, h=3.8)
    ax = fig.add_subplot()
    for s in series:
        st = style(s["style"])
        ax.scatter(s["x"], s["y"], label=shown(s["label"]), color=st["color"], marker=st["marker"], s=14, alpha=0.7)
    return _labelled(fig, ax, xlabel, ylabel, logy)


def _labelled(fig: Figure, ax: Any, xlabel: str, ylabel: str, logy: bool) -> str:
    """The axes' labels, legend and grid, and the figure as SVG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return to_svg(fig)


def capacity_curves(tiers: Sequence[dict[str, Any]]) -> str:
    """tiers: {name, capacities (bytes), shares, configured (bytes), knee (bytes or None)}: the
    share of prompt tokens each tier serves as its capacity varies (the others as configured),
    the configured capacity marked by a larger point, the knee by a vertical line."""
    fig = _fig("capacity")
    ax = fig.add_subplot()
    for i, t in enumerate(tiers):
        st = style(i)
        ax.plot(t["capacities"], t["shares"], label=f"{shown(t['name'])}", **st)
        at = t["capacities"].index(t["configured"]) if t["configured"] in t["capacities"] else None
        if at is not None:
            ax.plot([t["configured"]], [t["shares"][at]], color=st["color"], marker=st["marker"], markersize=11)
        if t["knee"] is not None:
            ax.axvline(t["knee"], color=st["color"], linestyle=st["linestyle"], alpha=0.5, linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("tier capacity (bytes, all its instances alike; the others as configured)")
    ax.set_ylabel("share of prompt tokens the tier serves")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_svg(fig)


def against(
    series: Sequence[tuple[str, Sequence[tuple[float, float | None]]]], xlabel: str, ylabel: str, log_x: bool
) -> str:
    """series: (label, its (x, y) points; y None where there is no figure)."""
    fig = _fig(f"against-{ylabel}")
    ax = fig.add_subplot()
    for i, (label, points) in enumerate(series):
        pts = [(a, b) for a, b in points if b is not None]
        ax.plot([a for a, _ in pts], [b for _, b in pts], label=shown(label), **style(i))
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return to_svg(fig)
