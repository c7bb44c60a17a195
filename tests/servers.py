"""A raw TCP server for client tests: each connection handled by `_one` in a thread of its own."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator


class ThreadedServer:
    """Listens on an ephemeral port of 127.0.0.1; `url` is its chat completions endpoint. A
    subclass sets what `_one` needs before calling this __init__, which starts accepting."""

    def __init__(self) -> None:
        self.accepted = 0  # connections
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1/chat/completions"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn = self.sock.accept()[0]
                self.accepted += 1
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()


def requests_on(conn: socket.socket) -> Iterator[tuple[bytes, bytes]]:
    """Each request a client sends on a connection: (head, body, by its Content-Length); ends
    when the client closes it."""
    raw = b""
    while True:
        while b"\r\n\r\n" not in raw:
            got = conn.recv(65536)
            if not got:
                return
            raw += got
        head, _, raw = raw.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        n = int(length.group(1)) if length else 0
        while len(raw) < n:
            got = conn.recv(65536)
            if not got:
                return
            raw += got
        yield head, raw[:n]
        raw = raw[n:]


def path_of(head: bytes) -> bytes:
    return head.split(b" ", 2)[1]
