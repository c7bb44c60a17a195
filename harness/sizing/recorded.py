"""Result folders as `kvbench size` reads them: a run's requests replayed (`[workload] result`), and an
engine's cost fitted to a TTFT sweep (`[engine] fit_from`).

A run's requests (`read`): each record's prompt cut into blocks by what its workload kind says the
prompt shares with the others (analysis/kinds: `Figures.prompt_parts`), arriving when it was meant
to be sent (`intended_s`: an open loop's schedule, a session's turn after its think time) or, for
a kind without one (a closed loop, a sweep), when it was sent: the load the measured server let it
offer, replayed as an open loop."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from harness.analysis import findings, stats
from harness.analysis.kinds import Parts, figures_of
from harness.config.context import MAX_CONTEXT_TOKENS
from harness.core.errors import InputError
from harness.inputs.traces import TraceRequest
from harness.results import RunResult, iter_requests, load_runs

INTENDED, SENT = "intended", "sent"  # sizing.json's result.arrivals


@dataclass(frozen=True)
class Recorded:
    """The requests of one arm of a result folder, as a trace's (arrival order not assumed)."""

    folder: Path
    arm: str
    kind: str
    status: str  # run.json's: a run that did not complete is replayed as far as it went
    requests: tuple[TraceRequest, ...]
    arrivals: str  # INTENDED where every request had a scheduled time, else SENT
    left_out: int  # records without a prompt length (or one longer than any context)
    skipped: tuple[str, ...]  # damaged lines of requests.jsonl


class BlockIds:
    """Block ids of prompts given as parts (`Parts`): block k of two prompts (the tokens up to
    its end, as prefix caching keys them) is the same exactly when both prompts' parts agree up
    to the block's end: the same parts, of the same lengths, before the part the block ends in,
    and that part's name. So block k ending in a part is numbered from where the part's chain
    (the parts before it, and its name) was first seen: `base + k - first`, a base per chain
    spaced by the blocks of the longest context."""

    def __init__(self, block_tokens: int) -> None:
        self.block = block_tokens
        self.stride = MAX_CONTEXT_TOKENS // block_tokens + 1
        self.bases: dict[tuple[object, ...], int] = {}

    def of(self, parts: Parts) -> tuple[int, ...]:
        ids: list[int] = []
        chain: tuple[object, ...] = ()
        start = 0
        for name, tokens in parts:
            if tokens <= 0:
                continue
            end = start + tokens
            first = start // self.block  # the first block ending inside this part
            key = (*chain, name)
            base = self.bases.setdefault(key, len(self.bases) * self.stride)
            ids += range(base, base + end // self.block - first)
            chain, start = (*chain, (name, tokens)), end
        return tuple(ids)


def read(path: Path, arm: str | None, block_tokens: int) -> Recorded:
    """The arm `arm` of the result folder at `path` (a run folder, or a scenario's folder: its
    newest run), or its only arm. InputError for a folder that is not one, an arm it does not
    have, or a kind whose records cannot say what their prompts share."""
    run = _arm(load_runs([path], itl=False, records=False), arm, path)
    figures = figures_of(run.kind)
    ids = BlockIds(block_tokens)
    skipped: list[str] = []
    requests: list[TraceRequest] = []
    sent: list[float] = []
    left_out, scheduled = 0, True
    answer = (run.scenario.get("endpoint") or {}).get("max_tokens")
    for record in iter_requests(run.folder, itl=False, skipped=skipped):
        n = record.context_tokens
        if not n or n > MAX_CONTEXT_TOKENS:
            left_out += 1
            continue
        scheduled = scheduled and record.intended_s is not None
        sent.append(record.start_s)
        # a failed request's answer: as long as it was asked to be
        out = record.completion_tokens if record.completion_tokens is not None else answer
        requests.append(
            TraceRequest(
                record.id,
                record.start_s if record.intended_s is None else record.intended_s,
                n,
                out if isinstance(out, int) and not isinstance(out, bool) and out > 0 else 1,
                ids.of(figures.prompt_parts(run, record)),
            )
        )
    if not scheduled:  # one clock for all: the schedule's where every request had one, else the sends'
        requests = [replace(r, timestamp_s=t) for r, t in zip(requests, sent, strict=True)]
    return Recorded(
        run.folder,
        run.arm,
        run.kind,
        str(run.meta.get("status")),
        tuple(requests),
        INTENDED if scheduled and requests else SENT,
        left_out,
        tuple(skipped),
    )


def _arm(runs: list[RunResult], arm: str | None, path: Path) -> RunResult:
    arms = [r.arm for r in runs]
    if arm is not None:
        for run in runs:
            if run.arm == arm:
                return run
        raise InputError(f"{path}: no arm named {arm!r} in its newest run (arms: {', '.join(arms)})")
    if len(runs) > 1:
        raise InputError(
            f"{path}: its newest run has {len(runs)} arms ({', '.join(arms)}): say which to replay "
            "([workload] arm = ...)"
        )
    return runs[0]


@dataclass(frozen=True)
class FittedCost:
    """An engine's cost fitted to a TTFT sweep's records (`[engine] fit_from`)."""

    prefill_a: float  # s per token
    prefill_b: float  # s per token^2
    decode_s_per_token: float
    kv_bytes_per_token: int | None  # the run's [model], where it said
    said: str  # where it came from, for sizing.json's engine.source


def fitted_cost(path: Path) -> FittedCost:
    """The prefill cost a*n + b*n^2 fitted to the cold requests of a TTFT sweep's result folder
    (every arm of its newest run: a cold request recomputes its prompt whatever the arm), as the
    report's cost-model fit does (findings.fit_prefill), and the decode time per token, the
    median TPOT of its requests. InputError where the folder cannot give them, or the fit is not
    a cost (a negative coefficient: lengths too few or too close for the curve)."""
    runs = load_runs([path], itl=False)
    records = [r for run in runs for r in run.records]
    prefill = findings.fit_prefill(records)
    if prefill is None:
        raise InputError(
            f"{path}: expected a TTFT sweep's result folder (cold requests at two or more lengths) to fit the "
            "engine's prefill a*n + b*n^2 to"
        )
    a, b = prefill
    if a < 0 or b < 0:
        raise InputError(
            f"{path}: the fit of its cold TTFTs gives prefill_a = {a:.3g}, prefill_b = {b:.3g}: not a cost (a "
            "sweep over more, and more distant, lengths fits one); or give prefill_a and prefill_b"
        )
    tpot = stats.values(records, "tpot_s")
    if not len(tpot):
        raise InputError(f"{path}: no request answered with two or more tokens: its decode time per token is unknown")
    kv = (runs[0].scenario.get("model") or {}).get("kv_bytes_per_token")
    cold = [r for r in records if r.phase == "cold" and r.ok and r.ttft_s is not None]
    lengths = len({r.context_tokens for r in cold})
    emulated = " (an emulated run: the emulator's model, not an engine's)" if runs[0].meta.get("emulated") else ""
    said = (
        f"fitted to {path}{emulated}: a*n + b*n^2 to the TTFTs of {len(cold)} cold requests at {lengths} lengths, "
        f"decode the median TPOT of {len(tpot)} requests"
    )
    return FittedCost(a, b, float(np.median(tpot)), kv if isinstance(kv, int) and kv > 0 else None, said)
