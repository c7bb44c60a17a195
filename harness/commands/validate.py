"""`kvbench validate SCENARIO...`: check scenario files without running them."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.errors import ExitCode


def main(scenarios: list[Path]) -> int:
    from harness.scenario import Context, load

    for path in scenarios:
        sc = load(path)
        w, more = sc.workload, ""
        if w.kind == "trace":  # the trace is input too: every line checked
            from harness import traces

            assert w.path is not None
            context = Context.of(sc)
            trace = traces.read(
                w.path, w.trace_format, w.block_tokens, w.skip_bad, context.tokens, f", {context.source}"
            )
            more = f", trace {w.path}: {len(trace.requests):,} requests"
            if (misfits := trace.misfit_warning()) is not None:
                print(f"{path}: warning: {misfits}", file=sys.stderr)
        print(f"{path}: ok ({w.kind}, arms: {', '.join(a.name for a in sc.arms)}, hash {sc.digest()}{more})")
    return ExitCode.OK
