"""A bench server that streams far faster than any client: raw asyncio protocol (uvloop when
installed), pre-encoded SSE chunks, batched writes. It records when it sent each request's first
token (monotonic ns, the clock kvbench uses), so a client's TTFT can be checked against it.

    python bench/firehose.py --port 0 --ttft-ms 200 --tokens 256 --timing-log server.jsonl [--tls CERT KEY]

Prints "firehose listening on http://127.0.0.1:PORT/v1" when ready. Speaks just enough of
OpenAI's API for kvbench: GET /v1/models, POST /tokenize (counts words), POST
/v1/chat/completions and /v1/completions (streaming). The output length is --tokens, whatever
max_tokens says.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import sys
import time

BATCH = 32  # tokens per write after the first


def chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def sse(obj: dict) -> bytes:
    return chunked(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class Server:
    def __init__(self, ttft_s: float, tokens: int, log_path: str | None, itl_s: float = 0.0) -> None:
        self.ttft_s, self.tokens, self.itl_s = ttft_s, tokens, itl_s
        self.log = open(log_path, "a") if log_path else None  # noqa: SIM115
        self.first_request_ns: int | None = None
        head = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "firehose"}
        self.role = sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        self.token = sse({**head, "choices": [{"index": 0, "delta": {"content": " tok"}}]})
        self.ctoken = sse({**head, "object": "text_completion", "choices": [{"index": 0, "text": " tok"}]})
        self.batch = self.token * BATCH
        self.cbatch = self.ctoken * BATCH
        self.done = (
            sse({**head, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": tokens}})
            + chunked(b"data: [DONE]\n\n")
            + b"0\r\n\r\n"
        )
        self.headers = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n"
        )
        self.models = json.dumps({"object": "list", "data": [{"id": "firehose", "object": "model"}]}).encode()


class Proto(asyncio.Protocol):
    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

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
        chat = path.endswith("chat/completions")
        t.write(srv.headers + (srv.role if chat else b""))
        await asyncio.sleep(max(0.0, arrived + srv.ttft_s - time.perf_counter()))
        if t.is_closing():
            return
        t.write(srv.token if chat else srv.ctoken)
        sent = time.perf_counter_ns()
        left = srv.tokens - 1
        batch = srv.batch if chat else srv.cbatch
        while left > 0 and not t.is_closing() and srv.itl_s > 0:  # paced, like a real engine
            await asyncio.sleep(max(0.0, sent / 1e9 + (srv.tokens - left) * srv.itl_s - time.perf_counter()))
            t.write(srv.token if chat else srv.ctoken)
            left -= 1
        while left > 0 and not t.is_closing():
            n = min(BATCH, left)
            t.write(batch if n == BATCH else (srv.token if chat else srv.ctoken) * n)
            left -= n
            await asyncio.sleep(0)  # let the other connections have their turn
        t.write(srv.done)
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
    a = ap.parse_args()
    srv = Server(a.ttft_ms / 1e3, a.tokens, a.timing_log, a.itl_ms / 1e3)
    loop = asyncio.get_running_loop()
    ctx = None
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*a.tls)
    server = await loop.create_server(lambda: Proto(srv), "127.0.0.1", a.port, backlog=4096, ssl=ctx)
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
