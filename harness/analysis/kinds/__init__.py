"""Each workload kind's figures (the analysis part of a kind; config/kinds/ says what a kind's
parts are): run.json's summary of an arm, its lines in the terminal, the figures it gives the gate,
and its report sections (as data: document.py), key figures and claims-audit figures. Pure:
records in, figures out. A kind without figures of its own names `PLAIN` (or `REUSES`) in its
spec; `figures_of(name)` finds a kind's figures by its spec."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from rich.console import Console
from rich.markup import escape

from harness.analysis import stats, wording
from harness.analysis.kinds.document import Card, Heading, Paragraph, Part, Section, Table
from harness.config import kinds
from harness.config.kinds.pool import PoolConfig
from harness.core.errors import InputError
from harness.results import RequestRecord, RunResult

if TYPE_CHECKING:
    from harness.config.scenario import Scenario

GateFigures = dict[tuple[str, int | None], float]  # (figure, prompt length or None) -> value
# A prompt as consecutive parts, each (what it is shared with, its tokens): `Figures.prompt_parts`
Parts = tuple[tuple[str, int], ...]


class Figures:
    """The figures of a kind sending requests at one load; a kind's own subclass adds to them."""

    def summary(self, records: stats.Records, slo: dict[str, float] | None = None) -> dict[str, Any]:
        """run.json's summary of one arm (or one load): `stats.summary`'s figures, the throughput,
        the kind's own (`figures`), and the schedule lag where requests had send times."""
        out = stats.summary(records)
        counted = stats.measured(records)
        out.update(stats.rates(counted))
        out.update(self.figures(records, counted, slo))
        if "schedule_lag" not in out and (~np.isnan(counted.numbers("intended_s"))).any():
            out["schedule_lag"] = stats.schedule_lag(counted)
        return out

    def figures(self, records: stats.Records, counted: stats.Records, slo: dict[str, float] | None) -> dict[str, Any]:
        """The kind's own summary figures, over the measured records (`counted`) of all."""
        return {}

    def show(self, console: Console, heading: str, s: dict[str, Any], unit: str) -> None:
        """An arm's summary in the terminal."""
        ttft = s["ttft_s"]
        fmt = wording.fmt
        console.print(
            f"[bold]{escape(heading)}[/]: {s['completed']}/{s['requests']} completed, "
            f"{fmt(s['req_per_s'], 3)} req/s, TTFT p50 {fmt(ttft['p50'])} s, p99 {fmt(ttft['p99'])} s, "
            f"duration {fmt(s['duration_s'], 2)} s{unit}"
        )
        if s.get("ttft_includes_restore"):
            console.print(f"  {stats.RESTORE_NOTE}", markup=False)
        for line in self.lines(s):
            console.print(f"  {line}", markup=False)

    def lines(self, s: dict[str, Any]) -> list[str]:
        """The terminal's lines under an arm's headline."""
        lag = s.get("schedule_lag")
        return [wording.sent(lag)] if lag and lag["requests"] else []

    def warnings(self, s: dict[str, Any]) -> list[str]:
        """What a summary's own figures say against themselves (run.json's warnings): a figure the
        emulator ran late in, judged on its own requests."""
        return []

    def traffic_req_per_s(self, s: dict[str, Any]) -> float | None:
        """The throughput competing traffic is judged by (the Redbooks' third test), if any."""
        return None

    def gate_figures(self, run: RunResult) -> GateFigures:
        """The figures a run gives once, for the gate: its throughput."""
        t = stats.throughput(stats.measured(run.records))
        return {
            (name, None): v
            for name, v in (
                ("req_per_s", t.req_per_s),
                ("steady_req_per_s", t.steady_req_per_s),
                ("output_tokens_per_s", t.output_tokens_per_s),
            )
            if v is not None
        }

    def sections(self, runs: list[RunResult]) -> list[Section]:
        """Report sections of the kind's own, over its runs (those with records)."""
        return []

    def prompt_parts(self, run: RunResult, record: RequestRecord) -> Parts:
        """What a request's prompt shares with the others' (`kvbench size` replaying a result
        folder): its tokens as consecutive parts, each named by what it is shared with. Two
        prompts that begin with the same parts, of the same lengths, share those parts' KV, block
        for block (a part whose name another prompt has at the same place shares as many tokens
        as both hold). By default, the workload's shared prefix (`shared_prefix_tokens`, every
        request's), then the prompt's own: a prompt sent again (a sweep's warm request) shares
        all of it. The prompts as the kind builds them, whatever an arm did to keep its cache
        cold. Raises InputError where the records cannot say."""
        n = record.context_tokens or 0
        shared = min(workload_tokens(run, "shared_prefix_tokens"), n)
        return (("shared", shared), (f"prompt {record.prompt_id}", n - shared))


@dataclass(frozen=True)
class Demand:
    """A kind's plan in tokens, as `kvbench size` takes it without running it (`[workload]
    scenario`; docs/sizing.md): per request, in the order the kind sends them, its prompt as parts
    (`Parts`, as `Figures.prompt_parts` names them), the tokens it asks for, and when it may be
    sent. Requests come in groups (a session's turns), each group's one after another: the first
    of a group `ready_s` after the arm's start, a later one `ready_s` after the one before it
    ended (the user's think time). Groups take one of `slots` in their order, and hold it from
    then until their last request ends (a session of `max_active`, a closed loop's connection
    per request); None: no bound."""

    parts: tuple[Parts, ...]
    output_tokens: tuple[int, ...]
    ready_s: tuple[float, ...]
    first: tuple[bool, ...]  # the first request of its group
    slots: int | None
    note: str = ""  # what of the scenario the plan leaves out or chooses (sizing.json says it)


@runtime_checkable
class Audited(Protocol):
    """A kind whose runs measure what the paper publishes: the figures of the report's claims
    audit a run gives (named as the audit names them, config/reference.py), and the key figures
    its runs put at the top of the report."""

    def claimed(self, run: RunResult) -> dict[str, float]: ...

    def cards(self, runs: list[RunResult]) -> list[Card]: ...


@runtime_checkable
class Planned(Protocol):
    """A kind whose plan `kvbench size` can take as its workload: its requests in tokens, from the
    scenario alone (pure, seeded as the run draws them)."""

    def demand(self, sc: Scenario) -> Demand: ...


def pool_demand(
    sc: Scenario, w: PoolConfig, picks: tuple[int, ...], ready_s: tuple[float, ...], slots: int | None, note: str = ""
) -> Demand:
    """A prompt pool's requests (closed and open loops), each a group of its own: the pool's
    prompt each picks, of the length the run draws for it (`PoolConfig.lengths`), its shared
    prefix and then its own tokens (as `Figures.prompt_parts` says of its record), asking for the
    endpoint's max_tokens. InputError for a pool read from a prompts file (their lengths are the
    tokenizer's, known as the run builds them)."""
    if sc.prompts.source == "file":
        raise InputError(
            f"{sc.path}: prompts.source: a prompts file's lengths are its tokenizer's, known as the run builds its "
            "prompts; run it and size its result folder ([workload] result = ...)"
        )
    lengths = w.lengths(sc.prompts.seed)
    shared = [min(w.shared_prefix_tokens, n) for n in lengths]
    parts = tuple((("shared", shared[p]), (f"prompt p{p:05d}", lengths[p] - shared[p])) for p in picks)
    n = len(picks)
    return Demand(parts, (sc.endpoint.max_tokens,) * n, ready_s, (True,) * n, slots, note)


class ReusesAcrossRequests(Figures):
    """A kind whose requests reuse each other's prefixes as they come (a trace, sessions): its
    summary says what share of the prompt tokens the server served from cache, and the terminal
    says it beside what an infinite cache could have."""

    def figures(self, records: stats.Records, counted: stats.Records, slo: dict[str, float] | None) -> dict[str, Any]:
        return {"cached_share": stats.cached_share(counted)}

    def lines(self, s: dict[str, Any]) -> list[str]:
        return [*wording.cached_lines(s), *super().lines(s)]


def restore_parts(rs: dict[str, Any], tiers: dict[str, Any] | None) -> list[Part]:
    """The restores kvbench made before warm requests, as the engine reported them
    (`findings.restores`), with the fio read probe of the same directory where the run has one."""
    read = (
        'How to read this: kvbench restored each prompt\'s file before sending its request; "request alone" is the '
        'request\'s own TTFT, and "with restore" adds the restore: the whole cost of coming back from disk, the '
        "figure every warm TTFT and speedup of this report shows. Read rate = bytes / restore time per restore; the "
        "fit restore = c + bytes / r gives the fixed cost c and the bandwidth r over all restores. KV bytes per "
        f"token (the engine's): {wording.num(rs['kv_bytes_per_token'])}."
    )
    columns = (
        "prompt tokens",
        "restores",
        "tokens read",
        "bytes read",
        "restore median (s)",
        "read rate median (GB/s)",
        "request alone: TTFT median (s)",
        "with restore (s)",
    )
    keys = ("length", "n", "tokens", "bytes", "restore_s_p50", "gb_per_s_p50", "warm_ttft_s_p50", "with_restore_s_p50")
    parts: list[Part] = [
        Heading("Restores from disk, as the engine reported them"),
        Paragraph(read, "read"),
        Table(columns, tuple(tuple(r[k] for k in keys) for r in rs["rows"]), digits=4),
    ]
    if rs["gb_per_s"]:
        parts.append(Paragraph(f"Fit: c = {wording.num(rs['c_s'], 4)} s, r = {wording.num(rs['gb_per_s'])} GB/s."))
    probe = (tiers or {}).get("fio_read")
    if probe:
        rate = probe.get("bytes_per_s")
        got = f"{wording.num(rate / 1e9)} GB/s" if rate else f"not measured: {probe.get('error')}"
        parts.append(Paragraph(f"fio on the same directory ({probe.get('job')}): {got}."))
    return parts


def workload_tokens(run: RunResult, key: str) -> int:
    """A token count of the run's `[workload]` table as run.json has it (0 where absent)."""
    v = (run.scenario.get("workload") or {}).get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


PLAIN = Figures()
REUSES = ReusesAcrossRequests()


def figures_of(name: str) -> Figures:
    """The figures of the kind named `name` (its spec's `figures`)."""
    found = kinds.part(kinds.get(name), "figures")
    if not isinstance(found, Figures):
        raise TypeError(f"workload kind {name!r}: its figures are a {type(found).__name__}, not Figures")
    return found
