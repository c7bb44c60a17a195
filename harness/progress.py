"""Progress while a run goes: a rich bar on a terminal, plain lines otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.stats import percentile


class RunProgress:
    def __init__(self, console: Console) -> None:
        self.console = console
        self.tty = console.is_terminal
        self._progress: Progress | None = None
        self._task: Any = None
        self._recent: deque[float] = deque(maxlen=200)
        self.errors = 0
        self.done = 0
        self.total = 0
        self.label = ""
        self._last_line = 0.0

    def start(self, label: str, total: int) -> None:
        self.label, self.total, self.done, self.errors = label, total, 0, 0
        self._recent.clear()
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
            self.console.print(f"{label}: {total} requests")
            self._last_line = time.monotonic()

    def note(self, text: str) -> None:
        """A status line (e.g. while prompts are built)."""
        if self._progress is not None:
            self._progress.update(self._task, description=f"{self.label} ({text})")
        elif time.monotonic() - self._last_line >= 5:
            self._last_line = time.monotonic()
            self.console.print(f"{self.label}: {text}")

    def advance(self, record: dict[str, Any]) -> None:
        self.done += 1
        if not record["ok"]:
            self.errors += 1
        elif record.get("ttft_s") is not None:
            self._recent.append(record["ttft_s"])
        p50 = percentile(list(self._recent), 50)
        p50_text = f"{p50:.3f}s" if p50 is not None else "-"
        if self._progress is not None:
            self._progress.update(self._task, advance=1, errors=self.errors, p50=p50_text, description=self.label)
        elif time.monotonic() - self._last_line >= 5 or self.done == self.total:
            self._last_line = time.monotonic()
            self.console.print(
                f"{self.label}: {self.done}/{self.total} done, {self.errors} errors, TTFT p50 {p50_text}"
            )

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())
