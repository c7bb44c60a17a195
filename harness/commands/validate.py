"""`kvbench validate SCENARIO...`: check scenario files without running them."""

from __future__ import annotations

from pathlib import Path

from harness.errors import ExitCode


def main(scenarios: list[Path]) -> int:
    from harness.scenario import load

    for path in scenarios:
        sc = load(path)
        print(f"{path}: ok ({sc.workload.kind}, arms: {', '.join(a.name for a in sc.arms)}, hash {sc.digest()})")
    return ExitCode.OK
