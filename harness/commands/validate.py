"""`kvbench validate SCENARIO...`: check scenario files without running them."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.core.errors import ExitCode


def main(scenarios: list[Path]) -> int:
    from harness.config.scenario import Context, load
    from harness.gate.rules import check_rules

    for path in scenarios:
        sc = load(path)
        check_rules(sc)
        w = sc.workload
        what, warnings = w.check_inputs(Context.of(sc))
        for warning in warnings:
            print(f"{path}: warning: {warning}", file=sys.stderr)
        more = f", {what}" if what else ""
        print(f"{path}: ok ({w.kind}, arms: {', '.join(a.name for a in sc.arms)}, hash {sc.digest()}{more})")
    return ExitCode.OK
