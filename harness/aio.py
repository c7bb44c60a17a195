"""One way to run the event loop: uvloop where installed (a faster loop means less client
overhead in every timestamp), else asyncio's own."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
