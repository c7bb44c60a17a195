"""Figures as inline SVG (matplotlib, text drawn as paths: no fonts to fetch). Each series
differs by marker and line style as well as colour, so the plots read without colour."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from harness.analysis.kinds.document import Bars, Lines, Scatter

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


def bars(plot: Bars, name: str) -> str:
    """A measured bar per label beside its published one (hatched), each with its value."""
    fig = _fig(name, h=3.8)
    ax = fig.add_subplot()
    x = np.arange(len(plot.labels))
    for shift, values, look in (
        (-0.2, plot.measured, {"label": "measured", "color": style(0)["color"]}),
        (0.2, plot.published, {"label": "published", "color": "white", "hatch": "//"}),
    ):
        ax.bar(x + shift, [v or 0.0 for v in values], 0.4, edgecolor="black", **look)
        for xi, v in zip(x, values, strict=True):
            ax.annotate("-" if v is None else f"{v:.3g}", (xi + shift, v or 0), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [shown(label).replace("/", "/\n") for label in plot.labels], fontsize=8)
    ax.set_ylabel(plot.y_label)
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


MARK_LINES = {"solid": "-", "dashed": "--", "dotted": ":"}


def lines(plot: Lines, name: str) -> str:
    """Curves (an interval as error bars or a band), vertical marks, published points (black
    crosses with their notes)."""
    fig = _fig(name, h=4.2 if plot.published else 3.8)
    ax = fig.add_subplot()
    for line in plot.lines:
        st = dict(style(line.style))
        if line.dotted:
            st["linestyle"] = ":"
        if line.draw == "points":
            st["linestyle"] = "none"
        elif line.draw == "curve":
            st.pop("marker")
        x = np.asarray(line.x, dtype=float)
        y = np.asarray([np.nan if v is None else v for v in line.y], dtype=float)
        label = shown(line.label)
        if line.lo and not line.band:
            err = np.abs(np.array([line.lo, line.hi], dtype=float) - y)
            ax.errorbar(x, y, yerr=err, label=label, capsize=3, **st)
            continue
        ax.plot(x, y, label=label, **st)
        if line.lo:
            ax.fill_between(x, line.lo, line.hi, alpha=0.2, color=st["color"], label=shown(line.band))
    for mark in plot.marks:
        look = {"color": "black"} if mark.style is None else {"color": style(mark.style)["color"], "alpha": 0.5}
        width = 2 if mark.line == "solid" and mark.style is not None else 1
        ax.axvline(mark.x, linestyle=MARK_LINES[mark.line], linewidth=width, label=shown(mark.label) or None, **look)
    for j, p in enumerate(plot.published):
        ax.plot([p.x], [p.y], label="published" if j == 0 else None, **PUBLISHED)
        at = (6, -12 if p.below else 6)
        ax.annotate(shown(p.note), (p.x, p.y), textcoords="offset points", xytext=at, fontsize=8)
    if plot.logx:
        ax.set_xscale("log")
    return _labelled(fig, ax, plot.x_label, plot.y_label, plot.logy)


def scatter(plot: Scatter, name: str) -> str:
    """A series of points per run, each in its own style."""
    fig = _fig(name, h=3.8)
    ax = fig.add_subplot()
    for i, s in enumerate(plot.series):
        st = style(i)
        ax.scatter(s.x, s.y, label=shown(s.label), color=st["color"], marker=st["marker"], s=14, alpha=0.7)
    return _labelled(fig, ax, plot.x_label, plot.y_label, plot.logy)


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
