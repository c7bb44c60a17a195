"""A raw TCP server for client tests: each connection handled by `_one` in a thread of its own."""

from __future__ import annotations

import contextlib
import socket
import threading


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
