"""A workload handed to sizing processes as files they map (numpy's memory-mapped `.npy`), written
once, instead of a pickled copy sent with every configuration: a sweep of a 10^7-request trace
would otherwise pickle some 4 GB of block references per configuration, and each process would
hold a copy of its own. Mapped read-only, the pages are the OS's page cache, shared by every
process on the host. (A Ray cluster's processes, on other hosts, get pickled copies.)"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.sizing.fleet import Workload
from harness.sizing.stack import References

ARRAYS = ("blocks", "request", "serves", "dense", "arrival_s", "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Mapped:
    """Where a workload's arrays are (one `.npy` file each) and its scalars: what a sizing
    process is sent for each configuration."""

    folder: Path
    prompt_tokens: int  # the trace's, in all
    requests: int
    block_keys: int  # distinct blocks (`References.dense`)
    block_tokens: int

    def load(self) -> Workload:
        """The workload over read-only maps of its files."""
        a = {name: np.load(self.folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS}
        refs = References(a["blocks"], a["request"], a["serves"], self.prompt_tokens, self.requests)
        vars(refs)["dense"] = (a["dense"], self.block_keys)  # its cached numbering, not sorted again
        return Workload(refs, a["arrival_s"], a["prompt_tokens"], a["output_tokens"], self.block_tokens)


@contextlib.contextmanager
def mapped(workload: Workload) -> Iterator[Mapped]:
    """The workload written to a temporary folder for as long as the block lasts."""
    refs = workload.refs
    dense, keys = refs.dense  # numbered here once, not in every process
    arrays = {
        "blocks": refs.blocks,
        "request": refs.request,
        "serves": refs.serves,
        "dense": dense,
        "arrival_s": workload.arrival_s,
        "prompt_tokens": workload.prompt_tokens,
        "output_tokens": workload.output_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="kvbench-size-") as tmp:
        for name, array in arrays.items():
            np.save(Path(tmp) / f"{name}.npy", np.ascontiguousarray(array))
        yield Mapped(Path(tmp), refs.prompt_tokens, refs.requests, keys, workload.block_tokens)
