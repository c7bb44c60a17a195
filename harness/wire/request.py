"""A streamed request's bytes: the head made once per URL, each request one write."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from harness import __version__
from harness.core.clock import SENT_HEADER
from harness.wire.connection import Origin

# Headers kvbench writes itself (from the body and the connection's use), whatever a user gives
_OWN = frozenset(("content-length", "transfer-encoding", "connection", "x-request-id"))


@dataclass(frozen=True)
class Target:
    """An endpoint URL made ready once: where its connections go, and the constant part of the
    request's head."""

    origin: Origin
    head: bytes

    @classmethod
    def of(cls, url: str, headers: dict[str, str]) -> Target:
        origin = Origin.of(url)
        u = urlsplit(url)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        lines = [f"POST {path} HTTP/1.1"]
        given = {k.lower() for k in headers}
        if "host" not in given:
            default = 443 if origin.tls else 80
            host = f"[{origin.host}]" if ":" in origin.host else origin.host
            lines.append(f"Host: {host}" if origin.port == default else f"Host: {host}:{origin.port}")
        if "user-agent" not in given:
            lines.append(f"User-Agent: kvbench/{__version__}")
        if "accept-encoding" not in given:  # a compressed stream is not decoded (response.py)
            lines.append("Accept-Encoding: identity")
        for k, v in headers.items():
            if k.lower() in _OWN:
                continue
            if any(c in k + v for c in "\r\n\0"):  # cli.py refuses these; never split a request
                raise ValueError(f"header {k!r} has a line break")
            lines.append(f"{k}: {v}")
        return cls(origin, ("\r\n".join(lines) + "\r\n").encode())

    def encode(self, body: bytes, request_id: str, close: bool, sent_ns: int | None) -> bytes:
        extra = b"X-Request-Id: %s\r\n" % request_id.encode()
        if close:
            extra += b"Connection: close\r\n"
        if sent_ns is not None:
            extra += b"%s: %d\r\n" % (SENT_HEADER.encode(), sent_ns)
        return b"%s%sContent-Length: %d\r\n\r\n%s" % (self.head, extra, len(body), body)
