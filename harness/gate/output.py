"""Gate verdicts as a terminal table, JUnit XML, Markdown and JSON (pure formatting)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree as ET

from harness.gate.verdicts import Verdict

SCHEMA_VERSION = 1
COLUMNS = ("verdict", "metric", "selector", "rule", "baseline", "candidate", "change", "limit")
MARK = {"pass": "pass", "fail": "FAIL", "within noise": "beyond limit but within noise", "missing": "MISSING DATA"}


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def cells(v: Verdict) -> list[str]:
    change = "-" if v.change_pct is None else f"{v.change_pct:+.1f}%"
    return [
        MARK[v.verdict],
        v.metric,
        v.selector or "(all)",
        v.rule,
        _num(v.baseline),
        _num(v.candidate),
        change,
        v.limit,
    ]


def markdown(verdicts: Sequence[Verdict], title: str) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(COLUMNS) + " | detail |", "|" + "---|" * (len(COLUMNS) + 1)]
    for v in verdicts:
        row = [c.replace("|", "\\|") for c in [*cells(v), v.detail]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def junit(verdicts: Sequence[Verdict], suite: str) -> str:
    root = ET.Element("testsuites", name="kvbench gate")
    ts = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(verdicts)),
        failures=str(sum(v.verdict == "fail" for v in verdicts)),
        errors=str(sum(v.verdict == "missing" for v in verdicts)),
        skipped="0",
        time="0",
    )
    for v in verdicts:
        case = ET.SubElement(ts, "testcase", classname=f"kvbench.gate.{suite}", name=v.name, time="0")
        message = (
            f"{v.metric}{v.selector} {v.rule}: baseline {_num(v.baseline)}, candidate {_num(v.candidate)}; {v.detail}"
        )
        if v.verdict == "fail":
            ET.SubElement(case, "failure", message=message, type="regression").text = message
        elif v.verdict == "missing":
            ET.SubElement(case, "error", message=message, type="missing-data").text = message
        else:
            ET.SubElement(case, "system-out").text = message
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def as_json(verdicts: Sequence[Verdict], meta: dict[str, Any], exit_code: int) -> str:
    return (
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                **meta,
                "exit_code": exit_code,
                "verdicts": [
                    {
                        "kind": v.kind,
                        "metric": v.metric,
                        "selector": v.selector,
                        "rule": v.rule,
                        "baseline": v.baseline,
                        "candidate": v.candidate,
                        "change_pct": v.change_pct,
                        "limit": v.limit,
                        "verdict": v.verdict,
                        "detail": v.detail,
                    }
                    for v in verdicts
                ],
            },
            indent=1,
        )
        + "\n"
    )
