"""`kvbench validate SCENARIO...`: check scenario files without running them."""

from __future__ import annotations

from pathlib import Path

from harness.errors import ExitCode


def main(scenarios: list[Path]) -> int:
    from harness.scenario import load

    for path in scenarios:
        sc = load(path)
        w, more = sc.workload, ""
        if w.kind == "trace":  # the trace is input too: every line checked
            from harness import traces

            assert w.path is not None
            trace = traces.read(w.path, w.trace_format, w.block_tokens, w.skip_bad)
            more = f", trace {w.path}: {len(trace.requests):,} requests"
        print(f"{path}: ok ({w.kind}, arms: {', '.join(a.name for a in sc.arms)}, hash {sc.digest()}{more})")
    return ExitCode.OK
