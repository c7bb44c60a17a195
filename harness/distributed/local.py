"""`kvbench run --workers N`: an arm sent by N processes on this host, one event loop each, so
that the client can use more than one core; coordinated as a Ray run is (coordinator.py), each
worker's messages over a pipe of its own (multiprocessing's).
All processes share the monotonic clock, so times line up without offsets."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import platform
import threading
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from harness.core import aio
from harness.distributed.coordinator import Pool
from harness.distributed.messages import Alive, Lost, Told
from harness.distributed.worker import Outgoing, hear_pipe, process_main
from harness.results import RunWriter
from harness.workloads.base import Plan, Sender


class LocalPool(Pool):
    noun = "processes"
    one = "worker process"
    engine = "processes"

    def __init__(
        self, sender: Sender, kind: str, plan: Plan, n: int, sink: RunWriter, send_clock: bool, lost_after_s: float
    ) -> None:
        self.emulator_here = send_clock
        super().__init__(sender, kind, plan, sink, list(range(n)), lost_after_s)
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: dict[int, Any] = {}
        self.conns: dict[int, Connection] = {}

    def send_clock(self, k: int) -> bool:
        return self.emulator_here

    async def start(self) -> None:
        headers = dict(self.sender.client.headers)
        loop = asyncio.get_running_loop()
        for k, share in self.shares.items():
            mine, theirs = self.ctx.Pipe(duplex=True)
            proc = self.ctx.Process(target=process_main, args=(theirs,), daemon=True)
            proc.start()
            theirs.close()
            self.procs[k], self.conns[k] = proc, mine
            mine.send(replace(share, headers=headers))  # one clock: no offset
            hearing = threading.Thread(
                target=hear_pipe, args=(mine, functools.partial(self._heard, loop, k), None), daemon=True
            )
            hearing.start()

    def _heard(self, loop: asyncio.AbstractEventLoop, k: int, said: Outgoing | None) -> None:
        """From worker k's pipe (its reader thread; None once the pipe ended): to the loop."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the run is over
            loop.call_soon_threadsafe(self._said, k, said)

    def _said(self, k: int, said: Outgoing | None) -> None:
        match said:
            case None:
                proc = self.procs[k]
                proc.join(timeout=0.5)  # it is ending: its exit code
                self.events.put_nowait((k, Lost(f"its process ended without a word (exit code {proc.exitcode})")))
            case _:
                self.events.put_nowait((k, said))

    def _send(self, k: int, said: Told) -> None:
        with contextlib.suppress(OSError, ValueError):  # it is gone: its end is seen by the reader
            self.conns[k].send(said)

    async def tell(self, k: int, said: Told) -> None:
        self._send(k, said)

    def vouch(self) -> None:
        for k in self.running:
            self._send(k, Alive())

    def starting(self, k: int) -> bool:
        return (proc := self.procs.get(k)) is not None and proc.is_alive()

    def kill(self, k: int) -> None:
        if (proc := self.procs.get(k)) is not None and proc.is_alive():
            proc.kill()

    def where(self, k: int) -> dict[str, Any]:
        proc = self.procs.get(k)
        return {"hostname": platform.node(), "pid": proc.pid if proc is not None else None}

    async def describe(self) -> dict[str, Any]:
        for proc in self.procs.values():  # each has said its last word, or is lost
            proc.join(timeout=aio.GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns.values():
            conn.close()
        workers = [
            {"worker": k, **self.where(k), "connections": s.connections, "lost": self.lost.get(k)}
            for k, s in self.shares.items()
        ]
        return {"engine": self.engine, "workers": workers}
