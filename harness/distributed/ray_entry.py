"""The process a Ray worker's actor starts to send its share (raypool.RayWorker.run runs
`python -m harness.distributed.ray_entry FD`). The actor's threads run on SCHED_BATCH
(raypool.batch_threads), which a process it starts inherits: the Ray launcher sets the usual
policy back here, where it spawns, before anything sends. Then it is the worker process
`--workers` starts too (worker.process_main), over the pipe end it inherited. No Ray in it."""

from __future__ import annotations

import contextlib
import os
import sys
from multiprocessing.connection import Connection

from harness.distributed.worker import process_main


def main(fd: int) -> None:
    """The worker process on pipe end `fd`, on the usual scheduling policy."""
    if hasattr(os, "SCHED_OTHER"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    process_main(Connection(fd))


if __name__ == "__main__":
    main(int(sys.argv[1]))
