"""Progress while a run goes: a rich bar on a terminal, plain lines otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.analysis.stats import percentile

RECENT = 200  # requests the live TTFT median is taken over
REFRESH_S = 0.1  # terminal display
LINE_S = 5.0  # plain lines in a log


class RunProgress:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.tty = console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._recent: deque[float] = deque(maxlen=RECENT)
        self.errors = 0
        self.done = 0
        self.total = 0
        self.label = ""
        self._last_line = 0.0

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.errors = label, total, 0, 0
        self._recent.clear()
        # numpy's first percentile takes ~7 ms of lazy set-up: pay it now, before any request is
        # in flight, not while the first responses' tokens wait to be stamped.
        percentile((0.0,), 50)
        if self.tty:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("errors {task.fields[errors]}  TTFT p50 {task.fields[p50]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total, errors=0, p50="-")
        else:
            self.console.print(f"{label}: {total} requests", markup=False)
        self._last_line = time.monotonic()

    def note(self, text: str) -> None:
        """A status line (e.g. while prompts are built)."""
        if self._progress is not None:
            self._progress.update(self._task, description=f"{self.label} ({text})")
        elif time.monotonic() - self._last_line >= 5:
            self._last_line = time.monotonic()
            self.console.print(f"{self.label}: {text}", markup=False)

    def advance(self, ok: bool, ttft_s: float | None) -> None:
        """One more request finished. The display (and its TTFT median) is refreshed at most every
        REFRESH_S on a terminal and every LINE_S in a log: a median per request would cost the
        client a share of its ceiling."""
        self.done += 1
        if not ok:
            self.errors += 1
        elif ttft_s is not None:
            self._recent.append(ttft_s)
        now = time.monotonic()
        last = self.done == self.total
        if self._progress is not None:
            if now - self._last_line >= REFRESH_S or last:
                self._last_line = now
                self._progress.update(
                    self._task, completed=self.done, errors=self.errors, p50=self._p50_text(), description=self.label
                )
        elif now - self._last_line >= LINE_S or last:
            self._last_line = now
            self.console.print(
                f"{self.label}: {self.done}/{self.total} done, {self.errors} errors, TTFT p50 {self._p50_text()}",
                markup=False,
            )

    def _p50_text(self) -> str:
        p50 = self.p50
        return f"{p50:.3f}s" if p50 is not None else "-"

    @property
    def p50(self) -> float | None:
        """TTFT median of the last RECENT requests that succeeded."""
        return percentile(self._recent, 50)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=self.done, errors=self.errors, p50=self._p50_text())
            self._progress.stop()
            self._progress = None


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())
