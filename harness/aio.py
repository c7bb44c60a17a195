"""One way to run the event loop: uvloop where installed (a faster loop means less client
overhead in every timestamp), else asyncio's own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Coroutine
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
