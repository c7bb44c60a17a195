"""One way to run the event loop: uvloop where installed (a faster loop means less client
overhead in every timestamp), else asyncio's own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# After Ctrl-C (or SIGTERM in a worker process), in-flight requests get this long (wall-clock)
# to finish before they are dropped.
GRACE_S = 5.0


def loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def run(coro: Coroutine[Any, Any, T]) -> T:
    factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def freeze_heap() -> None:
    """Call before the clock starts. Python's full collections walk every object the process
    holds (some 300,000 after importing aiohttp, numpy and rich): a 20-40 ms pause in the middle
    of a run, during which no arriving byte is stamped. Objects alive now (modules, prompts)
    live for the whole run, so they are collected once here and left out of later collections."""
    gc.collect()
    gc.freeze()


# While an open loop sends, automatic young collections wait for this many allocations (memory
# stays bounded) and the ones the usual thresholds ask for run where the schedule leaves a gap of
# GAP_COLLECT_NS: a middle-generation collection with ~200 requests in flight takes 1-5 ms, and a
# send that falls due during it is late by as much (docs/performance.md, issue 18).
YOUNG_LIMIT = 50_000
GAP_COLLECT_NS = 2_000_000


@contextlib.contextmanager
def collections_in_gaps() -> Iterator[tuple[int, int, int]]:
    """Put off automatic collections; yields the thresholds `collect_in_gap` keeps to."""
    usual = gc.get_threshold()
    gc.set_threshold(YOUNG_LIMIT, usual[1], usual[2])
    try:
        yield usual
    finally:
        gc.set_threshold(*usual)


def collect_in_gap(left_ns: int, usual: tuple[int, int, int]) -> None:
    """With `left_ns` to the next send: the collection the usual thresholds would have run by now."""
    if left_ns < GAP_COLLECT_NS:
        return
    young, middle, _ = gc.get_count()
    if middle >= usual[1]:
        gc.collect(1)
    elif young >= usual[0]:
        gc.collect(0)


async def until_done_or_stopped(job: Coroutine[Any, Any, T], stop: asyncio.Event) -> asyncio.Task[T]:
    """Run `job` until it ends or `stop` is set; then give it GRACE_S to finish what is in flight
    and cancel it. Returns its task, done either way (the caller decides about its result)."""
    task = asyncio.ensure_future(job)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=GRACE_S)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return task
