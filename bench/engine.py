"""A bench server that streams as an inference engine does, unlike bench/firehose.py: aiohttp
(as engines' own HTTP servers are, uvicorn or aiohttp, not a raw protocol), one write per SSE
event, each chunk with the request's own id and its own token text (vLLM's chunk shape), and
the engine's rhythm: the role chunk with the headers at once, the first token after the TTFT,
then one token every ITL, then a finish chunk, a usage chunk and [DONE].

The truth it logs for each request is the monotonic time (the clock kvbench uses) just before the
first token's bytes are handed to the socket: aiohttp's `StreamResponse.write` calls the
transport's `write` before it first yields, so nothing runs between the stamp and the hand-over.

    python bench/engine.py --port 0 --ttft-ms 200 --itl-ms 10 --tokens 128 --timing-log server.jsonl

Prints "engine listening on http://127.0.0.1:PORT/v1" when ready. GET /v1/models, POST
/tokenize (counts words), POST /v1/chat/completions and /v1/completions (streaming; the output
length is --tokens, whatever max_tokens says).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import socket
import sys
import time
import uuid

from aiohttp import web

WORDS = [" the", " cache", " tier", " of", " storage", " a", " token", ",", " KV", " scale", " prefill", "."]


def event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Engine:
    def __init__(self, ttft_s: float, itl_s: float, tokens: int, log_path: str | None) -> None:
        self.ttft_s, self.itl_s, self.tokens = ttft_s, itl_s, tokens
        self.log = open(log_path, "a") if log_path else None  # noqa: SIM115
        self.rng = random.Random(1)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "engine", "object": "model"}]})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"count": body.count(b" ") + 1})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        await request.read()
        chat = request.path.endswith("chat/completions")
        rid = request.headers.get("X-Request-Id", "")
        head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}" if chat else f"cmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": "engine",
        }

        def token(text: str | None, finish: str | None = None) -> bytes:
            if chat:
                delta = {} if text is None else {"content": text}
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return event({**head, "choices": [choice]})

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if chat:
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            await resp.write(event({**head, "choices": [role]}))
        await asyncio.sleep(max(0.0, arrived + self.ttft_s - time.perf_counter()))
        first_ns = time.perf_counter_ns()  # the write below hands the bytes over before it yields
        await resp.write(token(self.rng.choice(WORDS)))
        for i in range(1, self.tokens):
            await asyncio.sleep(max(0.0, first_ns / 1e9 + i * self.itl_s - time.perf_counter()))
            await resp.write(token(self.rng.choice(WORDS)))
        await resp.write(token(None, "length"))
        usage = {"prompt_tokens": 0, "completion_tokens": self.tokens, "total_tokens": self.tokens}
        await resp.write(event({**head, "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        if self.log:
            self.log.write(f'{{"request_id":"{rid}","first_token_ns":{first_ns}}}\n')
        return resp


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--timing-log")
    a = ap.parse_args()
    engine = Engine(a.ttft_ms / 1e3, a.itl_ms / 1e3, a.tokens, a.timing_log)
    app = web.Application()
    app.router.add_get("/v1/models", engine.models)
    app.router.add_post("/tokenize", engine.tokenize)
    app.router.add_post("/v1/chat/completions", engine.complete)
    app.router.add_post("/v1/completions", engine.complete)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", a.port), backlog=4096)
    await web.SockSite(runner, sock).start()
    port = sock.getsockname()[1]
    print(f"engine listening on http://127.0.0.1:{port}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    if engine.log:
        engine.log.close()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    sys.exit(asyncio.run(main()))
