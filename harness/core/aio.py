"""One way to run the event loop: uvloop where installed (a faster loop means less client
overhead in every timestamp), else asyncio's own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# After Ctrl-C (or SIGTERM in a worker process), in-flight requests get this long (wall-clock)
# to finish before they are cut short (each recorded `interrupted`).
GRACE_S = 5.0
# After a second Ctrl-C, how long the run still takes to keep the records of what it cut short
# before whatever it is doing is cancelled (s): the stop is at once, and nothing in flight is
# left without its record unless this runs out.
HURRY_S = 1.0


class Stopping(asyncio.Event):
    """A run's stop. Set (Ctrl-C, SIGTERM, a worker told `Stop`): nothing new is sent, what is in
    flight gets its grace. `hurry()` (pressed again): the grace ends at once; what is in flight is
    cut short and recorded so (wire.client.InFlightCancelled), not dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.now = asyncio.Event()

    def hurry(self) -> None:
        self.set()
        self.now.set()


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
    live for the whole run, so they are collected once here and left out of later collections.
    What an earlier arm left frozen (`Collections`) is collected here too."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


# While a loop sends, the collector does not scan what the run allocates: a young collection with
# ~200 requests in flight takes 1-5 ms, and a send that falls due during it is late by as much
# (docs/performance.md, issue 13); so is the read of a first token that arrives during it, and the
# kernel then merges the token with the next one under the later stamp (at 256 connections, tokens
# 1 ms apart, over https: p99 errors of 2-5 ms, 0.01-0.04 ms without; issue 52). Young objects
# are frozen instead (`gc.freeze`, which moves them out of the collector's reach without looking
# at them). Reference counting still frees every object that is not in a reference cycle; cycles
# are rare on the request path, and those made while sending wait for the next `freeze_heap`, or
# for a collection of everything once the run's frozen objects pass FROZEN_LIMIT (at the next gap
# of GAP_COLLECT_NS in an open loop's schedule; a closed loop's next request), so memory stays
# bounded. Automatic young collections wait for YOUNG_LIMIT allocations meanwhile.
YOUNG_LIMIT = 50_000
FROZEN_LIMIT = 1_000_000
GAP_COLLECT_NS = 2_000_000


class Collections:
    """The collector's thresholds while a loop sends (`collections_in_gaps`)."""

    def __init__(self) -> None:
        self.usual = gc.get_threshold()
        self.frozen = 0  # net tracked allocations frozen since the last full collection
        self.frozen_limit = FROZEN_LIMIT

    def in_gap(self, left_ns: int) -> None:
        """With `left_ns` to the next send (a closed loop, which has no schedule, passes
        GAP_COLLECT_NS): freeze what a young collection would have scanned by now; collect
        everything when too much has been frozen and the gap allows."""
        young = gc.get_count()[0]
        if young < self.usual[0]:
            return
        if self.frozen + young <= self.frozen_limit:
            self.frozen += young
            gc.freeze()
        elif left_ns >= GAP_COLLECT_NS:
            freeze_heap()
            self.frozen = 0


@contextlib.contextmanager
def collections_in_gaps() -> Iterator[Collections]:
    """Put off automatic collections for the `Collections` it yields to handle."""
    held = Collections()
    gc.set_threshold(YOUNG_LIMIT, held.usual[1], held.usual[2])
    try:
        yield held
    finally:
        gc.set_threshold(*held.usual)


async def until_done_or_stopped(
    job: Awaitable[T], stop: asyncio.Event, grace_s: float = GRACE_S, cut: asyncio.Event | None = None
) -> asyncio.Task[T]:
    """Run `job` until it ends or `stop` is set; then give it `grace_s` to finish what is in
    flight (less, if `cut` is set meanwhile) and cancel it. Returns its task, done either way
    (the caller decides about its result)."""
    task = asyncio.ensure_future(job)
    stopped = asyncio.ensure_future(stop.wait())
    hurried = asyncio.ensure_future(cut.wait()) if cut is not None else None
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and grace_s > 0:
            ends: set[asyncio.Future[Any]] = {task} if hurried is None else {task, hurried}
            await asyncio.wait(ends, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if hurried is not None:
            hurried.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return task


async def together(*jobs: Awaitable[Any]) -> None:
    """Await every job, each in a task; the first to fail has the others cancelled and waited for
    before its error is raised. (asyncio.gather leaves them running: a closed loop's other
    connections went on sending after a full disk failed one, and wrote their records into the
    file the run had closed meanwhile, a traceback at exit.)"""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def unless_stopped(job: Awaitable[T], stop: asyncio.Event) -> T:
    """`job`'s result, unless `stop` is set first: then it is cancelled at once (nothing of it is
    in flight at a server: preparation, such as sizing prompts) and CancelledError raised."""
    task = await until_done_or_stopped(job, stop, grace_s=0.0)
    if task.cancelled():
        raise asyncio.CancelledError
    return task.result()
