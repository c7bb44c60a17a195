"""A rate-limited reader/writer in Python, for machines without fio: threads moving large
page-aligned buffers, O_DIRECT where the filesystem allows it. Labelled "builtin" everywhere:
it is a plain load generator, not a storage benchmark."""

from __future__ import annotations

import asyncio
import mmap
import os
import threading
import time
from pathlib import Path

from harness.config.traffic import TrafficCfg
from harness.core.clock import ModelClock
from harness.traffic.base import TrafficResult, cleanup_directory, prepare_directory, settings_of


class BuiltinDriver:
    def __init__(self, cfg: TrafficCfg, folder: Path, run_name: str) -> None:
        self.cfg = cfg
        self.run_name = run_name
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.read_bytes = 0
        self.write_bytes = 0
        self.samples: list[tuple[float, int, int]] = []
        self.work: Path | None = None
        self.created: list[Path] = []
        self.direct_used = False
        self.errors: list[str] = []
        self.started_mono = 0.0

    async def start(self) -> None:
        self.work, self.created = prepare_directory(
            self.cfg.directory or "", self.cfg.allow_nonempty_directory, self.run_name
        )
        n = self.cfg.jobs_per_client
        rate = (self.cfg.target_bytes_per_s or 0) / n
        reads = self.cfg.rw in ("read", "randread") or (self.cfg.rw in ("rw", "randrw") and self.cfg.rwmixread > 0)
        for i in range(n):
            path = self.work / f"kvbench-traffic.{i}"
            if reads:
                await asyncio.to_thread(self._layout, path)
            t = threading.Thread(target=self._worker, args=(path, rate, i), daemon=True)
            self.threads.append(t)
        self.started_mono = time.monotonic()
        for t in self.threads:
            t.start()
        sampler = threading.Thread(target=self._sample, daemon=True)
        self.threads.append(sampler)
        sampler.start()

    def _open(self, path: Path, flags: int) -> int:
        if self.cfg.direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(path, flags | os.O_DIRECT, 0o600)
                self.direct_used = True
                return fd
            except OSError:
                pass  # the filesystem refuses O_DIRECT (tmpfs, some overlays): buffered I/O then
        return os.open(path, flags, 0o600)

    def _layout(self, path: Path) -> None:
        buf = mmap.mmap(-1, self.cfg.block_size)
        fd = self._open(path, os.O_WRONLY | os.O_CREAT)
        try:
            for _ in range(max(1, self.cfg.file_size // self.cfg.block_size)):
                os.write(fd, buf)
        finally:
            os.close(fd)

    def _worker(self, path: Path, rate: float, index: int) -> None:
        bs = self.cfg.block_size
        buf = mmap.mmap(-1, bs)  # page-aligned, as O_DIRECT wants
        blocks = max(1, self.cfg.file_size // bs)
        reads = self.cfg.rw in ("read", "randread")
        mixed = self.cfg.rw in ("rw", "randrw")
        flags = os.O_RDWR | os.O_CREAT
        try:
            fd = self._open(path, flags)
        except OSError as e:
            self.errors.append(f"{path}: {e}")
            return
        start = time.monotonic()
        done = 0
        k = 0
        try:
            while not self.stop_event.is_set():
                offset = (k % blocks) * bs
                k += 1
                do_read = reads or (mixed and (k % 100) < self.cfg.rwmixread)
                if do_read:
                    n = os.preadv(fd, [buf], offset)
                    if n <= 0:
                        k = 0
                        continue
                    with self.lock:
                        self.read_bytes += n
                else:
                    n = os.pwritev(fd, [buf], offset)
                    with self.lock:
                        self.write_bytes += n
                done += n
                if rate > 0:  # token bucket: sleep until this many bytes are due
                    ahead = done / rate - (time.monotonic() - start)
                    if ahead > 0:
                        self.stop_event.wait(ahead)
        except OSError as e:
            self.errors.append(f"{path}: {e}")
        finally:
            os.close(fd)

    def _sample(self) -> None:
        while not self.stop_event.wait(1.0):
            with self.lock:
                self.samples.append((time.monotonic(), self.read_bytes, self.write_bytes))

    async def stop(self, clock: ModelClock) -> TrafficResult:
        self.stop_event.set()
        for th in self.threads:
            await asyncio.to_thread(th.join, 10)
        if self.work is not None:
            cleanup_directory(self.work, self.created)
        rows = []
        prev = (self.started_mono, 0, 0)
        for t, r, w in self.samples:
            dt = t - prev[0]
            rows.append(
                {
                    "t_s": clock.at_mono(prev[0]),
                    "client": "local",
                    "read_bps": (r - prev[1]) / dt,
                    "write_bps": (w - prev[2]) / dt,
                }
            )
            prev = (t, r, w)
        res = TrafficResult(
            "builtin",
            settings_of(self.cfg),
            self.cfg.target_bytes_per_s,
            rows,
            {
                "local": {
                    "read_bytes": float(self.read_bytes),
                    "write_bytes": float(self.write_bytes),
                    "seconds": (prev[0] - self.started_mono),
                }
            },
            note=f"kvbench's builtin generator ({'O_DIRECT' if self.direct_used else 'buffered I/O'})",
        )
        res.warnings += self.errors[:5]
        return res
