"""`kvbench validate SCENARIO...`: check scenario files (and sizing files) without running them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.config.tables import read_toml
from harness.core.errors import ExitCode


def is_sizing(data: dict[str, Any]) -> bool:
    """A sizing file (`kvbench size`) has [cluster] and [[tiers]]; no scenario has either."""
    return "cluster" in data and "tiers" in data


def main(scenarios: list[Path]) -> int:
    from harness.commands.context import known_context
    from harness.config.scenario import check_lengths, parse
    from harness.gate.rules import check_rules, parse_rules
    from harness.sizing import config as sizing

    for path in scenarios:
        data = read_toml(path, "scenario file")  # read once, as a sizing file or a scenario
        if is_sizing(data):
            spec = sizing.parse(data, path)
            if spec.gate is not None:
                parse_rules(spec.gate, str(path))
            n = len(spec.configurations())
            more = ""
            if spec.workload.scenario is not None:  # its plan, as `kvbench size` will take it
                from harness.sizing import planned

                slo_from = path if spec.slo_ttft_s is not None else None
                kind, demand = planned.demand_of(spec.workload.scenario, slo_from)
                more = f"; the plan of a {kind} scenario: {len(demand.parts):,} requests"
            print(f"{path}: ok (sizing file for `kvbench size`, {n} configuration{'s' if n > 1 else ''}{more})")
            continue
        sc = parse(data, str(path))
        check_rules(sc)
        # bounded as `kvbench run FILE` would bound it: by the engine it starts, or the emulator's
        # profile, when the file names no endpoint
        engine = sc.engine if sc.endpoint.url is None else None
        context = known_context(sc, sc.endpoint.url is None and engine is None, engine)
        check_lengths(sc, context)
        w = sc.workload
        what, warnings = w.check_inputs(context)
        for warning in warnings:
            print(f"{path}: warning: {warning}", file=sys.stderr)
        more = f", {what}" if what else ""
        print(f"{path}: ok ({w.kind}, arms: {', '.join(a.name for a in sc.arms)}, hash {sc.digest()}{more})")
    return ExitCode.OK
