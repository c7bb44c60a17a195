"""What a workload kind's report section holds, as data: a title, a sentence on how to read it,
a table and plots, then any further parts in order (paragraphs, headings, tables, plots). The
report escapes every text, formats every number and draws every plot (report/sections.py,
report/plots.py); a kind says what to show, never how it looks in HTML or SVG. Pure and frozen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Series:
    """One run's points in a kind's plot."""

    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]


@dataclass(frozen=True)
class Scatter:
    """A plot a kind's section asks the report to draw: a series of points per run, its axes'
    labels, and a caption that says what it shows."""

    caption: str
    x_label: str
    y_label: str
    series: tuple[Series, ...]
    logy: bool = False


@dataclass(frozen=True)
class Line:
    """A curve of a `Lines` plot: y against x (None: no figure there), in the report's style
    number `style` (a colour with its own marker and dash, so that it reads without colour).
    `lo`/`hi`, where given, are an interval around each y: drawn as error bars, or as a band
    where `band` names it in the legend. `draw`: "line" (line and markers), "points" (markers
    only) or "curve" (line only)."""

    label: str
    x: tuple[float, ...]
    y: tuple[float | None, ...]
    style: int = 0
    lo: tuple[float, ...] = ()
    hi: tuple[float, ...] = ()
    band: str = ""
    draw: Literal["line", "points", "curve"] = "line"
    dotted: bool = False


@dataclass(frozen=True)
class Mark:
    """A vertical line at x (a capacity, a saturated rate, a break-even length): in a line's style
    number, or black where None; with a legend entry where labelled."""

    x: float
    label: str = ""
    style: int | None = None
    line: Literal["solid", "dashed", "dotted"] = "solid"


@dataclass(frozen=True)
class Published:
    """A published figure placed on a plot: a black cross with its note beside it (below the
    point where `below`, so that two notes at one x stay apart)."""

    x: float
    y: float
    note: str
    below: bool = False


@dataclass(frozen=True)
class Lines:
    """Curves against one x axis, with vertical marks and published points."""

    caption: str
    x_label: str
    y_label: str
    lines: tuple[Line, ...]
    marks: tuple[Mark, ...] = ()
    published: tuple[Published, ...] = ()
    logx: bool = False
    logy: bool = False


@dataclass(frozen=True)
class Bars:
    """A measured figure per run beside its published one (hatched); None: none."""

    caption: str
    y_label: str
    labels: tuple[str, ...]
    measured: tuple[float | None, ...]
    published: tuple[float | None, ...]


Plot = Scatter | Lines | Bars


@dataclass(frozen=True)
class Flag:
    """A table cell the report marks as a warning."""

    text: str


# A table cell: text, a number (the report formats it: `Table.digits` significant digits,
# integers whole), None ("-"), or a flagged text
Cell = str | int | float | Flag | None


@dataclass(frozen=True)
class Table:
    """A table among a section's parts; `folded`: shown folded under that summary line; `marked`:
    the rows (by index) the report marks as warnings."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    digits: int = 3
    folded: str = ""
    marked: tuple[int, ...] = ()


@dataclass(frozen=True)
class Paragraph:
    """A paragraph: "read" says how to read what follows, "plain" states a figure, "finding"
    stands out as a key result, "warning" as something wrong with it."""

    text: str
    tone: Literal["read", "plain", "finding", "warning"] = "plain"


@dataclass(frozen=True)
class Heading:
    """A heading inside a section."""

    text: str


Part = Paragraph | Heading | Table | Plot


@dataclass(frozen=True)
class Section:
    """A report section a kind adds: a title, a sentence saying what it shows, its plots and a
    table (every cell text or a number; none without columns), then `parts` in order."""

    title: str
    text: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    plots: tuple[Plot, ...] = ()
    parts: tuple[Part, ...] = ()


@dataclass(frozen=True)
class Card:
    """A key figure at the top of the report: what it is, its value as text, and the published
    one where the paper has it."""

    title: str
    value: str
    published: str | None = None
