"""When a read's bytes arrived: the kernel's receive stamp where it gives one, else the time the
event loop read them.

Linux stamps every segment it receives; with `SO_TIMESTAMPNS` set on a TCP socket, each `recvmsg`
carries the stamp of the newest data it returns (CLOCK_REALTIME). A stamp taken in user space waits
behind whatever CPU work stood in front of the read (parsing other streams, garbage collection,
other processes on the core); the kernel's does not. Linux merges consecutive segments in a
socket's receive queue, so a read that finds the first token and later data carries the later
data's stamp: for a burst, microseconds later; for tokens paced apart and a client late by more
than their gap, up to that lateness (turns.py's `FirstTokenWatch` reads first tokens ahead
of the loop's turn so that this is rare). Never later than a user-space stamp of the same read.

The kernel's clock is converted to the monotonic one (`time.perf_counter_ns`, the clock of every
other stamp) by the offset between the two (`WallToMonotonic`). Linux slews both alike (NTP's
frequency corrections apply to CLOCK_MONOTONIC too): they differ only by the wall clock's steps.
So the offset is measured as the narrowest of a few paired readings (monotonic, wall, monotonic)
and renewed every REFRESH_NS, not taken at each read: a single pair read at a busy moment can be
split by a preemption, and the offset then moves a stamp by as much (29 us once, found by a test
on a loaded host). `Stamp.late_ns` (the user-space stamp minus the kernel's) is the client's own
lateness at that read, measured directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import time
from dataclasses import dataclass

# Linux's SO_TIMESTAMPNS (and SCM_TIMESTAMPNS, the same number), where the socket module lacks it
TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform.startswith("linux") else None)
_TIMESPEC = struct.Struct("@ll")  # struct timespec: tv_sec, tv_nsec
# room for the one control message a read carries (0: stamps are not asked for)
ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) if TIMESTAMPNS is not None and hasattr(socket, "CMSG_SPACE") else 0

KERNEL, USER = "kernel", "user"  # RequestRecord.first_token_stamp
# run.json's first_token_stamps.kernel_clock: how a kernel stamp became a monotonic one
KERNEL_CLOCK = (
    "the kernel's receive stamp (SO_TIMESTAMPNS, CLOCK_REALTIME), moved onto time.perf_counter_ns's "
    "monotonic clock by the offset between the two clocks: the narrowest of three paired readings, "
    "renewed every second (the two differ only by steps of the wall clock)"
)
READY_S = 1.0  # how long a pool waits, before its first connection, for the kernel to stamp
REFRESH_NS = 1_000_000_000  # the offset between the clocks is measured again after this long
PAIRS = 3  # paired readings per measurement: the narrowest bracket is kept


@dataclass(frozen=True, slots=True)
class Stamp:
    """When a read's bytes arrived (monotonic ns) and, for the kernel's stamp, how much later
    the client read them (None: stamped in user space, lateness unknown). `held_more`: the read
    also brought bytes that cannot be read yet (a TLS record in part), whose arrival the stamp is."""

    t_ns: int
    late_ns: int | None = None
    held_more: bool = False

    @property
    def source(self) -> str:
        return USER if self.late_ns is None else KERNEL


def ask_kernel(sock: socket.socket) -> bool:
    """Ask the kernel to stamp this socket's reads; False where it will not (another OS, the
    option refused): its reads are then stamped in user space."""
    if TIMESTAMPNS is None or not ANCILLARY_BYTES:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class KernelStamping:
    """Keeps the kernel stamping arrivals for as long as a pool lives, and waits until it does.

    Linux stamps received packets only while some socket on the machine has asked for stamps, and
    turns stamping on from a work queue, after the first socket asks; it turns it off again, the
    same way, after the last such socket has closed. A connection opened and answered at once
    (or the first after every other closed, between arms) could thus read its first token before
    any stamp was taken: on this project's 2-core VM, of 20 loopback connections each asking for
    stamps and answered 0.5 ms after it opened, 18 got no stamp idle and 8 under load. So a pool
    holds a loopback pair of its own that asks for stamps for the pool's whole life and, before
    its first connection, waits (READY_S at most) until a byte sent over that pair arrives
    stamped. Where it never does, reads are stamped in user space, as the records and run.json
    say."""

    __slots__ = ("_pair", "_ready")

    def __init__(self) -> None:
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._ready: asyncio.Task[bool] | None = None

    async def ready(self) -> bool:
        """True once the kernel stamps arrivals: found once (the connections opened meanwhile
        wait for the same answer), then remembered."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._find())
        return await asyncio.shield(self._ready)

    async def _find(self) -> bool:
        pair = self._hold()
        return pair is not None and await self._stamped(*pair)

    def _hold(self) -> tuple[socket.socket, socket.socket] | None:
        sender = receiver = None
        try:
            with socket.create_server(("127.0.0.1", 0)) as listener:
                receiver = socket.create_connection(listener.getsockname())
                sender, _ = listener.accept()
            receiver.setblocking(False)
            if ask_kernel(receiver):
                self._pair = (sender, receiver)
                return self._pair
        except OSError:
            pass
        for sock in (sender, receiver):
            if sock is not None:
                sock.close()
        return None

    @staticmethod
    async def _stamped(sender: socket.socket, receiver: socket.socket) -> bool:
        deadline = time.perf_counter() + READY_S
        while True:
            try:
                sender.send(b".")
                with contextlib.suppress(BlockingIOError):
                    if receiver.recvmsg(4096, ANCILLARY_BYTES)[1]:
                        return True
            except OSError:
                return False
            if time.perf_counter() >= deadline:
                return False
            await asyncio.sleep(0.001)

    def close(self) -> None:
        if self._ready is not None:
            self._ready.cancel()
        if self._pair is not None:
            for sock in self._pair:
                sock.close()
            self._pair = None


class WallToMonotonic:
    """The wall clock's offset from the monotonic one (wall - monotonic, ns), measured when first
    asked for and again once it is REFRESH_NS old. One per connection pool."""

    __slots__ = ("offset_ns", "taken_ns")

    def __init__(self) -> None:
        self.offset_ns, self.taken_ns = 0, -REFRESH_NS

    def at(self, mono_ns: int) -> int:
        if mono_ns - self.taken_ns >= REFRESH_NS:
            self.measure()
        return self.offset_ns

    def measure(self) -> None:
        narrowest, offset, after = -1, 0, 0
        for _ in range(PAIRS):
            before = time.perf_counter_ns()
            wall = time.time_ns()
            after = time.perf_counter_ns()
            if narrowest < 0 or after - before < narrowest:
                narrowest, offset = after - before, wall - (before + after) // 2
        self.offset_ns, self.taken_ns = offset, after


def of_read(ancdata: list[tuple[int, int, bytes]], user_ns: int, clocks: WallToMonotonic) -> Stamp:
    """The stamp of a read that `recvmsg` has just returned with these control messages, at
    `user_ns` (time.perf_counter_ns, taken right after it returned)."""
    for level, kind, data in ancdata:  # (one message at most: only the stamp is asked for)
        if kind == TIMESTAMPNS and level == socket.SOL_SOCKET and len(data) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(data)
            return from_kernel(sec * 1_000_000_000 + nsec, user_ns, clocks.at(user_ns))
    return Stamp(user_ns)


def from_kernel(kernel_real_ns: int, user_ns: int, offset_ns: int) -> Stamp:
    """The kernel's wall-clock stamp on the monotonic clock (wall - `offset_ns`). A stamp that
    would come after the read (the offset's own uncertainty, tens of ns) is the read's."""
    late = user_ns - (kernel_real_ns - offset_ns)
    return Stamp(user_ns - late, late) if late > 0 else Stamp(user_ns, 0)
