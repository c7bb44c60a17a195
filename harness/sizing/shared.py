"""What a sweep's sizing processes share, handed over once instead of with every configuration
(docs/sizing.md, "Sweeps"): the workload, and each fleet.Placement and fleet.Baseline that several
configurations need. A sweep of 16 configurations of a 10^7-request trace would otherwise pickle
some 4 GB of block references per configuration, and compute the same stack distances (some 50 s
and 1.5 GB a tier) in each.

A `Store` takes a value and gives back a small `Handle` that any process of the sweep can `load`:
- `Here`: the value itself (one process);
- `Files`: the value pickled into a folder with its arrays' bytes in files of their own (pickle
  protocol 5's out-of-band buffers), which `load` maps read-only: the pages are the OS's page
  cache, shared by every process on the host;
- on a Ray cluster, Ray's object store (distributed/raypool.py `ObjectStore`), whose nodes' processes
  read arrays without copying them as well.
"""

from __future__ import annotations

import mmap
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class Handle(Protocol):
    def load(self) -> Any:
        """The value put (its arrays read-only where it was handed over between processes)."""
        ...


class Store(Protocol):
    def put(self, value: Any) -> Handle: ...


@dataclass(frozen=True)
class Kept:
    """A value handed over within one process."""

    value: Any

    def load(self) -> Any:
        return self.value


class Here:
    """A store for one process: nothing copied."""

    def put(self, value: Any) -> Kept:
        return Kept(value)


HEAD = "value.pickle"  # the pickle, its arrays' bytes apart (0.bytes, 1.bytes ...)


@dataclass(frozen=True)
class OnDisk:
    """A value in a folder of its own (Files.put)."""

    folder: Path
    buffers: int

    def load(self) -> Any:
        return pickle.loads((self.folder / HEAD).read_bytes(), buffers=[self._map(i) for i in range(self.buffers)])

    def _map(self, i: int) -> mmap.mmap | bytes:
        with (self.folder / f"{i}.bytes").open("rb") as f:
            size = f.seek(0, 2)
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""  # (nothing to map)


@dataclass(frozen=True)
class Files:
    """A store of files in `folder` (a temporary one the sweep removes when its processes have
    stopped), for processes of one host."""

    folder: Path

    def put(self, value: Any) -> OnDisk:
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
        folder = Path(tempfile.mkdtemp(dir=self.folder))
        for i, buffer in enumerate(buffers):
            (folder / f"{i}.bytes").write_bytes(buffer.raw())
        (folder / HEAD).write_bytes(head)
        return OnDisk(folder, len(buffers))
