"""Assemble a report: every section recomputed from the runs' raw records (sections.py), the
published figures beside, rendered into one self-contained HTML file."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from harness import __version__
from harness.analysis.wording import num
from harness.config.reference import redbooks
from harness.core.errors import write_file
from harness.report import sections
from harness.results import RunResult


def base() -> dict[str, Any]:
    """What every report says of itself."""
    return {
        "generated": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "version": __version__,
    }


def build_context(runs: list[RunResult]) -> dict[str, Any]:
    rows = [sections.run_row(r) for r in runs]
    measured = sections.measured_claims(runs)
    return {
        **base(),
        "source": redbooks()["source"],
        "runs": rows,
        "emulated": any(x["emulated"] for x in rows),
        "any_interrupted": any(x["status"] != "completed" for x in rows),
        "cards": sections.cards(runs, measured),
        **sections.claims(measured),
        # the paper's claims audit: only for runs of a scenario that names a published test
        "show_claims": any(r.reference_test for r in runs),
        **sections.distributions(runs),
        **sections.timelines(runs),
        **sections.verification(runs),
        **sections.traffic(runs),
        **sections.versus_recompute(runs),
        **sections.kind_sections(runs),
        **sections.server(runs),
        **sections.clients(runs),
    }


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("harness.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = num
    return env


def render(runs: list[RunResult], out: Path) -> Path:
    html = environment().get_template("report.html.j2").render(**build_context(runs))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, html)
    return out
