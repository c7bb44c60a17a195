"""A bench server that streams far faster than any client: raw asyncio protocol (uvloop when
installed), pre-encoded SSE chunks, batched writes. It records when it sent each request's first
token (monotonic ns, the clock kvbench uses), so a client's TTFT can be checked against it.

    python bench/firehose.py --port 0 --ttft-ms 200 --tokens 256 --timing-log server.jsonl [--tls CERT KEY]
        [--itl-ms MS] [--framing chunked|length] [--first role|content] [--one-write] [--nagle]

Prints "firehose listening on http://127.0.0.1:PORT/v1" when ready. Speaks just enough of
OpenAI's API for kvbench: GET /v1/models, POST /tokenize (counts words), POST
/v1/chat/completions and /v1/completions (streaming). The output length is --tokens, whatever
max_tokens says.

The headers go out when a request arrives, with a role-only chunk (`--first role`, the default,
as vLLM does) or alone (`--first content`: the first chunk, at the TTFT, carries the role and the
first token). The body is chunked (`--framing chunked`) or one Content-Length body
(`--framing length`, every byte known ahead). After the first token, the rest come `--itl-ms`
apart, or at once: 32 a write with a turn of the loop between, or all in one write
(`--one-write`, a server that writes a response's tokens in one burst). The truth logged is the
monotonic time just before the first token's bytes are handed to the socket. `--nagle` leaves
Nagle's algorithm on (no TCP_NODELAY, which asyncio sets by default), as Dynamo 1.6.1's frontend
does: a small write waits while an earlier one is unacknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import ssl
import sys
import time

BATCH = 32  # tokens per write after the first


def chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Body:
    """One endpoint's pre-encoded response pieces (chat or completions), framed as asked."""

    def __init__(self, chat: bool, tokens: int, framing: str, first: str) -> None:
        head = {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0}
        head["model"] = "firehose"

        def choice(delta: dict) -> dict:
            return {"index": 0, "delta": delta} if chat else {"index": 0, "text": delta.get("content", "")}

        frame = chunked if framing == "chunked" else (lambda payload: payload)
        role_first = chat and first == "role"
        self.role = (
            frame(event({**head, "choices": [choice({"role": "assistant", "content": ""})]})) if role_first else b""
        )
        first_delta = {"content": " tok"} if role_first or not chat else {"role": "assistant", "content": " tok"}
        self.first = frame(event({**head, "choices": [choice(first_delta)]}))
        self.token = frame(event({**head, "choices": [choice({"content": " tok"})]}))
        usage = {"prompt_tokens": 0, "completion_tokens": tokens}
        self.done = frame(event({**head, "choices": [], "usage": usage})) + frame(b"data: [DONE]\n\n")
        if framing == "chunked":
            self.done += b"0\r\n\r\n"
            length = b"Transfer-Encoding: chunked"
        else:
            size = len(self.role) + len(self.first) + len(self.token) * (tokens - 1) + len(self.done)
            length = b"Content-Length: %d" % size
        self.headers = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n%s\r\nConnection: keep-alive\r\n\r\n" % (
            length
        )
        self.batch = self.token * BATCH


class Server:
    def __init__(
        self,
        ttft_s: float,
        tokens: int,
        log_path: str | None,
        itl_s: float = 0.0,
        framing: str = "chunked",
        first: str = "role",
        one_write: bool = False,
    ) -> None:
        self.ttft_s, self.tokens, self.itl_s, self.one_write = ttft_s, tokens, itl_s, one_write
        self.log = open(log_path, "a") if log_path else None  # noqa: SIM115
        self.first_request_ns: int | None = None
        self.bodies = {chat: Body(chat, tokens, framing, first) for chat in (True, False)}
        self.models = json.dumps({"object": "list", "data": [{"id": "firehose", "object": "model"}]}).encode()


class Proto(asyncio.Protocol):
    def __init__(self, srv: Server, nagle: bool = False) -> None:
        self.srv, self.nagle = srv, nagle
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.nagle:
            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:])}
            length = int(headers.get("content-length", 0))
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, path = head[0].split(" ")[:2]
            self.handle(method, path, headers, body)

    def reply(self, status: str, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status.encode(), len(payload), payload)
        )

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        srv = self.srv
        if srv.first_request_ns is None and path.endswith("completions"):
            srv.first_request_ns = time.perf_counter_ns()
            print(f"first request at {srv.first_request_ns}", flush=True)
        if path == "/v1/models":
            self.reply("200 OK", srv.models)
        elif path == "/tokenize":
            self.reply("200 OK", b'{"count": %d}' % (body.count(b" ") + 1))
        elif path.endswith("completions"):
            asyncio.get_running_loop().create_task(
                self.stream(headers.get("x-request-id", ""), path, time.perf_counter())
            )
        else:
            self.reply("404 Not Found", b"{}")

    async def stream(self, rid: str, path: str, arrived: float) -> None:
        srv, t = self.srv, self.transport
        assert t is not None
        body = srv.bodies[path.endswith("chat/completions")]
        t.write(body.headers + body.role)
        await asyncio.sleep(max(0.0, arrived + srv.ttft_s - time.perf_counter()))
        if t.is_closing():
            return
        sent = time.perf_counter_ns()
        t.write(body.first)
        left = srv.tokens - 1
        while left > 0 and not t.is_closing() and srv.itl_s > 0:  # paced, like a real engine
            await asyncio.sleep(max(0.0, sent / 1e9 + (srv.tokens - left) * srv.itl_s - time.perf_counter()))
            t.write(body.token)
            left -= 1
        if left > 0 and srv.one_write:  # the rest in one burst
            t.write(body.token * left)
            left = 0
        while left > 0 and not t.is_closing():
            n = min(BATCH, left)
            t.write(body.batch if n == BATCH else body.token * n)
            left -= n
            await asyncio.sleep(0)  # let the other connections have their turn
        t.write(body.done)
        if srv.log:
            srv.log.write(f'{{"request_id":"{rid}","first_token_ns":{sent}}}\n')


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--timing-log")
    ap.add_argument("--itl-ms", type=float, default=0.0, help="pace the tokens (0: as fast as possible)")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), help="serve https with this certificate")
    ap.add_argument("--framing", choices=("chunked", "length"), default="chunked")
    ap.add_argument("--first", choices=("role", "content"), default="role", help="what the first chunk carries")
    ap.add_argument("--one-write", action="store_true", help="the tokens after the first in one write")
    ap.add_argument("--nagle", action="store_true", help="leave Nagle's algorithm on (no TCP_NODELAY)")
    a = ap.parse_args()
    srv = Server(a.ttft_ms / 1e3, a.tokens, a.timing_log, a.itl_ms / 1e3, a.framing, a.first, a.one_write)
    loop = asyncio.get_running_loop()
    ctx = None
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*a.tls)
    server = await loop.create_server(lambda: Proto(srv, a.nagle), "127.0.0.1", a.port, backlog=4096, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    scheme = "https" if ctx else "http"
    print(f"firehose listening on {scheme}://127.0.0.1:{port}/v1", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()
    if srv.log:
        srv.log.close()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sys.exit(asyncio.run(main()))
