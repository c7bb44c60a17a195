"""Is the server alive at all? A frozen or stopped server still accepts connections (the kernel
completes them) and then says nothing, which the idle timeout (300 s by default, as a long
prefill needs) would take minutes to call. So while a request has heard nothing from the server
for `liveness_s`, the client asks the server something cheap (`GET .../models`, on the control
plane): any answer within `liveness_probe_s` proves it alive and the request waits on; no answer,
and every request that has heard nothing fails at once, saying why (`Exchange.dead`).

One watcher per client, running only while requests are in flight, one question at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from harness.wire.client import Exchange

# probe(url, within_s): did the server answer `url` (with any status) within `within_s`?
Probe = Callable[[str, float], Awaitable[bool]]


def probe_url(stream_url: str) -> str:
    """The models list beside a completions URL (its query string, e.g. an api-version, kept)."""
    u = urlsplit(stream_url)
    path = u.path.removesuffix("/chat/completions").removesuffix("/completions")
    return urlunsplit((u.scheme, u.netloc, path + "/models", u.query, ""))


@dataclass
class _Waiting:
    url: str
    ex: Exchange
    deadline: asyncio.Timeout
    heard_ns: int = 0  # when a probe last proved the server alive for it

    def quiet_since(self) -> int:
        return max(self.ex.start_ns, self.ex.last_read_ns, self.heard_ns)


class Liveness:
    def __init__(self, after_s: float, probe_s: float, probe: Probe) -> None:
        self.after_ns, self.probe_s, self.probe = int(after_s * 1e9), probe_s, probe
        self.waiting: dict[int, _Waiting] = {}
        self.task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def watching(self, url: str, ex: Exchange, deadline: asyncio.Timeout) -> Iterator[None]:
        """While the block runs, `ex` is watched; should the server be found dead, its
        `deadline` is moved to now (a TimeoutError in the block) and `ex.dead` says why."""
        if not self.after_ns:
            yield
            return
        self.waiting[id(ex)] = _Waiting(url, ex, deadline)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._watch())
        try:
            yield
        finally:
            del self.waiting[id(ex)]

    async def _watch(self) -> None:
        every = min(1.0, self.after_ns / 1e9 / 10)
        while self.waiting:
            await asyncio.sleep(every)
            now = time.perf_counter_ns()
            quiet = [w for w in self.waiting.values() if now - w.quiet_since() >= self.after_ns]
            if not quiet:
                continue
            url = probe_url(quiet[0].url)
            if await self.probe(url, self.probe_s):
                for w in quiet:
                    w.heard_ns = now
                continue
            why = (
                f"timeout: the server sent nothing for {self.after_ns / 1e9:g} s (liveness_s) and did not answer "
                f"GET {urlsplit(url).path} within {self.probe_s:g} s (liveness_probe_s): it is not alive"
            )
            loop = asyncio.get_running_loop()
            for w in quiet:
                if id(w.ex) in self.waiting and w.quiet_since() <= now:
                    w.ex.dead = why
                    w.deadline.reschedule(loop.time())

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
