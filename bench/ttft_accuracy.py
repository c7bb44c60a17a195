"""How far kvbench's first-token time is from the server's own send time, on one monotonic clock, the
server on core 1 and kvbench on core 0.

The matrix: bench/firehose.py, which stamps its truth just before it hands the first token's
bytes to the socket, in every condition users meet:
- framing: chunked, or one Content-Length body;
- the tokens after the first: at once (one write: a server that writes a response's tokens in one
  burst), 1 ms apart, 20 ms apart;
- 8, 128 and 1,024 tokens per response;
- a role-only first chunk with the headers (vLLM's way), or a first chunk that already carries
  the first token;
- 28 and 256 connections, closed loop, TTFT 200 ms;
- http and https.
Each row leaves out its first wave of requests (as many as connections, sent together at the
start) and measures the next two waves. `--busy` runs every row beside a busy loop pinned to the
client's core (another tenant of the core: the client gets about half of it); `--open` adds rows of
an open loop (Poisson) at 80 % of the client's ceiling (measured first: TTFT 0, 28 connections,
256 tokens at once), tokens at once.

    python bench/ttft_accuracy.py [--busy] [--open] [--against REV] [KEY=VALUE ...]   # the whole matrix
    python bench/ttft_accuracy.py engine [requests]   # bench/engine.py only, 3 runs (default 1500)
    python bench/ttft_accuracy.py nagle [--against REV] [pairs]   # a server without TCP_NODELAY

KEY=VALUE keeps the rows whose factor has that value (framing=length, gap=0, tokens=128, first=role,
connections=28, scheme=https; several: all must hold). `--against REV` runs each row with the tree
of REV as well, old and new in turns (the old first in odd rows), each on a line. Prints one table:
per row, the client's req/s and CPU, the first-token error (client - server send) mean / p50 / p99 /
max in ms, and what run.json says of the client: its lateness p99 (ms after the kernel's stamp that
it read the first token) and how many first tokens came in one read with later data of their
response (`shared`). A row passes (ok) where the issue's bound holds: mean at most 0.1 ms and p99 at most
0.3 ms where the tokens come at once or 20 ms apart; at most the 1 ms gap where they come 1 ms
apart.

`nagle`: the firehose with Nagle's algorithm on (`--nagle`, as Dynamo 1.6.1's frontend), its head and
role chunk written on arrival and the first token 2 ms later, 8 tokens, one connection and then 28,
kept alive: a first token written while the head is unacknowledged waits for the client's
acknowledgement, which Linux delays by 40 ms at least after a send unless the client asks for it at
once (TCP_QUICKACK, harness/wire/connection.py). Prints the error per run, with `--against REV` the
old tree and this one in turns, `pairs` times (default 3)."""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from common import CODE, POISSON, ROOT, STREAMING, Firehose, checkout, client_cores, kvbench_run, pct, pin

from harness.results import read_requests

TTFT_S = 0.2
ENGINE_TOKENS, ENGINE_ITL_MS = 128, 10.0
WAVES = 3  # of requests per row: the first left out
FACTORS = {
    "scheme": ("http", "https"),
    "framing": ("chunked", "length"),
    "first": ("role", "content"),
    "tokens": (8, 128, 1024),
    "gap": (0.0, 1.0, 20.0),  # ms between tokens after the first; 0: all in one write
    "connections": (28, 256),
}


@dataclass(frozen=True)
class Row:
    scheme: str
    framing: str
    first: str
    tokens: int
    gap: float
    connections: int
    open_rate: float = 0.0  # req/s of an open loop; 0: a closed loop

    def shape(self) -> tuple[str, ...]:
        return ("--framing", self.framing, "--first", self.first, *(("--one-write",) if not self.gap else ()))

    def bound(self) -> tuple[float, float]:
        """The issue's bound on (mean, p99) error in ms for this row."""
        return (self.gap, self.gap) if self.gap and self.gap < 20 else (0.1, 0.3)

    def label(self) -> str:
        gap = "at once" if not self.gap else f"{self.gap:g} ms"
        loop = f"open {self.open_rate:.0f}/s" if self.open_rate else f"{self.connections} conns"
        return f"{self.scheme:5s} {self.framing:7s} {self.first:7s} {self.tokens:5d} {gap:>7s} {loop:>13s}"


def errors(
    scenario: str,
    itl_ms: float,
    ttft_ms: float,
    tokens: int = 256,
    script: str = "firehose.py",
    skip: int = 0,
    shape: tuple[str, ...] = (),
    tls: bool = False,
) -> tuple[dict, list[float]]:
    """One kvbench run against a server that logs its send times: (run.json, first-token errors
    in ms of the measured requests from id `skip` on)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.jsonl"
        with Firehose(ttft_ms, tokens, log, itl_ms, script, tls, shape) as fh:
            (folder,) = kvbench_run(scenario, fh.base_url, Path(tmp))
        meta = json.loads((folder / "run.json").read_text())
        sent = {d["request_id"]: d["first_token_ns"] for d in map(json.loads, log.read_text().splitlines())}
        errs = []
        for r in read_requests(folder):
            if r.phase != "warmup" and r.id > skip and r.ttft_s is not None:
                client = meta["t0_monotonic_ns"] + (r.start_s + r.ttft_s) * 1e9
                errs.append((client - sent[f"{meta['run_id']}-default-{r.id}"]) / 1e6)
        return meta, errs


def run(
    n: int, conc: int, itl_ms: float, ttft_ms: float = TTFT_S * 1e3, shape: tuple[str, ...] = ()
) -> tuple[dict, list[float]]:
    """One closed-loop run against the firehose (256 tokens): (run.json, first-token errors in ms
    after the first `conc` requests)."""
    scenario = STREAMING.format(name="accuracy", requests=n, concurrency=conc)
    return errors(scenario, itl_ms, ttft_ms, skip=conc, shape=shape)


def run_engine(n: int, conc: int = 28) -> tuple[dict, list[float]]:
    """One closed-loop run against the engine-like server: (run.json, first-token errors in ms of
    the requests after the first `conc`)."""
    scenario = STREAMING.format(name="accuracy", requests=n, concurrency=conc)
    return errors(scenario, ENGINE_ITL_MS, TTFT_S * 1e3, tokens=ENGINE_TOKENS, script="engine.py", skip=conc)


def run_open(n: int, rate: float, shape: tuple[str, ...] = ()) -> tuple[dict, list[float]]:
    """One open-loop run (256 tokens at once): (run.json, first-token errors of measured requests).
    With Poisson arrivals, when requests start does not depend on how fast the client finishes
    the ones before."""
    return errors(POISSON.format(name="accuracy", rate=rate, requests=n), 0.0, TTFT_S * 1e3, shape=shape)


def measure(row: Row) -> tuple[dict, list[float]]:
    scenario = (
        POISSON.format(name="accuracy", rate=row.open_rate, requests=max(1500, int(row.open_rate * 6)))
        if row.open_rate
        else STREAMING.format(name="accuracy", requests=WAVES * row.connections, concurrency=row.connections)
    )
    scenario = scenario.replace("max_tokens = 256", f"max_tokens = {row.tokens}")
    skip = 0 if row.open_rate else row.connections
    return errors(scenario, row.gap, TTFT_S * 1e3, row.tokens, skip=skip, shape=row.shape(), tls=row.scheme == "https")


@contextlib.contextmanager
def busy_loop(on: bool) -> Iterator[None]:
    """A process that spins on the client's core for as long as it is open (`on`)."""
    if not on:
        yield
        return
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: pin(client_cores()))
    try:
        yield
    finally:
        spin.kill()
        spin.wait()


HEADER = (
    "scheme framing first   tokens     gap          load  req/s  client_cpu  err_mean  err_p50  err_p99  err_max"
    "  late_p99  shared  ok"
)


def line(row: Row, meta: dict, errs: list[float]) -> str:
    health = meta["client_health"]
    late = (health.get("lateness") or {}).get("late_ms") or {}
    shared = (health.get("lateness") or {}).get("shared_reads", 0)
    mean, p99 = statistics.mean(errs), pct(errs, 99)
    limit = row.bound()
    ok = "yes" if mean <= limit[0] and p99 <= limit[1] else "NO"
    late_p99 = f"{late['p99']:8.3f}" if late.get("p99") is not None else f"{'-':>8s}"
    return (
        f"{row.label()}  {meta['summary']['req_per_s']:5.0f}  {health['cpu_share_of_one_core']['mean'] or 0:10.0%}"
        f"  {mean:8.3f}  {pct(errs, 50):7.3f}  {p99:7.3f}  {max(errs):7.2f}  {late_p99}  {shared:6d}  {ok:>3s}"
    )


def ceiling() -> float:
    """The client's req/s at TTFT 0, 28 connections, 256 tokens at once (median of 3)."""
    rates = [run(1500, 28, 0.0, ttft_ms=0, shape=("--one-write",))[0]["summary"]["req_per_s"] for _ in range(3)]
    return statistics.median(rates)


def rows(only: dict[str, str], open_rate: float) -> list[Row]:
    out = [Row(*values) for values in itertools.product(*FACTORS.values())]
    if open_rate:
        for scheme, framing in itertools.product(FACTORS["scheme"], FACTORS["framing"]):
            out.append(Row(scheme, framing, "role", 128, 0.0, 0, open_rate))
    return [r for r in out if all(same(getattr(r, k), v) for k, v in only.items())]


def same(value: object, given: str) -> bool:
    """Is a row's factor the value given on the command line?"""
    return value == float(given) if isinstance(value, float) else str(value) == given


NAGLE_TTFT_MS, NAGLE_TOKENS = 2.0, 8


def nagle(args: list[str]) -> None:
    """The `nagle` mode (the module docstring says what it runs)."""
    against = args[args.index("--against") + 1] if "--against" in args else None
    pairs = next((int(a) for a in args if a.isdigit() and a != against), 3)
    print("firehose without TCP_NODELAY: head and role chunk on arrival, the first token 2 ms later, 8 tokens")
    print("tree conns  err_mean  err_p50  err_p99  err_max  (ms; requests after the first wave)")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"new": ROOT} if against is None else {"old": checkout(against, Path(tmp)), "new": ROOT}
        for i, conc in enumerate(c for _ in range(pairs) for c in (1, 28)):
            for name, tree in list(trees.items())[:: 1 if i % 2 == 0 else -1]:
                CODE["root"] = tree
                scenario = STREAMING.format(name="nagle", requests=max(300, 10 * conc), concurrency=conc)
                scenario = scenario.replace("max_tokens = 256", f"max_tokens = {NAGLE_TOKENS}")
                shape = ("--nagle", "--one-write")
                _, errs = errors(scenario, 0.0, NAGLE_TTFT_MS, NAGLE_TOKENS, skip=conc, shape=shape)
                print(
                    f"{name:4s} {conc:5d}  {statistics.mean(errs):8.3f}  {pct(errs, 50):7.3f}  {pct(errs, 99):7.3f}"
                    f"  {max(errs):7.2f}",
                    flush=True,
                )


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["nagle"]:
        nagle(args[1:])
        return
    if args[:1] == ["engine"]:
        n = int(args[1]) if len(args) > 1 else 1500
        print("engine-like server (bench/engine.py): 128 tokens 10 ms apart, 28 connections")
        for _ in range(3):
            meta, errs = run_engine(n)
            print(f"  error mean {statistics.mean(errs):.3f} ms, p99 {pct(errs, 99):.3f} ms, max {max(errs):.2f} ms")
        return
    only = dict(a.split("=", 1) for a in args if "=" in a)
    busy = "--busy" in args
    against = args[args.index("--against") + 1] if "--against" in args else None
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"new": ROOT} if against is None else {"old": checkout(against, Path(tmp)), "new": ROOT}
        open_rate = 0.0
        if "--open" in args:
            top = ceiling()
            open_rate = 0.8 * top
            print(f"client ceiling (TTFT 0, 28 connections, 256 tokens at once; median of 3): {top:.0f} req/s")
        print(("beside a busy loop on the client's core\n" if busy else "") + ("tree " if against else "") + HEADER)
        failed = 0
        for i, row in enumerate(rows(only, open_rate)):
            for name, tree in list(trees.items())[:: 1 if i % 2 == 0 else -1]:
                CODE["root"] = tree
                with busy_loop(busy):
                    meta, errs = measure(row)
                text = line(row, meta, errs)
                failed += name == "new" and text.endswith("NO")
                print((f"{name:4s} " if against else "") + text, flush=True)
        print(f"{failed} row(s) of this tree outside the bound")


if __name__ == "__main__":
    main()
