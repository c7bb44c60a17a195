"""The emulated OpenAI-compatible endpoint (aiohttp).

Delays follow the cost model of `profiles.py`, scheduled against deadlines measured from the
moment a request arrived, so the emulator's own parsing and hashing do not add to the modelled
time (as long as they take less time than the modelled delay).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web

from harness.analysis.stats import percentile
from harness.core.clock import EMULATOR_LATE_KEY, SENT_HEADER, TIMER_GRANULARITY_S
from harness.emulator import tokenizer
from harness.emulator.kvcache import KVCache, Match, block_hashes
from harness.emulator.metrics import Counters, render
from harness.emulator.profiles import Profile

_PROMPT_CACHE_SIZE = 256
LATE_KEPT = 100_000  # requests whose lateness is kept (bounded memory for endless runs)
_OUTPUT_WORDS = ("the", "cache", "block", "token", "storage", "tier", "load", "prompt")


async def sleep_until(deadline: float, precise: bool = False) -> None:
    """Sleep until a perf_counter deadline. The event loop wakes up to 1 ms late (epoll rounds
    to ms); `precise` yields in a tight loop for the last 2 ms, which matters at high time scales."""
    while (left := deadline - time.perf_counter()) > 0:
        if left > 0.002 or not precise:
            await asyncio.sleep(left - 0.0015 if precise else left)
        else:
            await asyncio.sleep(0)


@dataclass(frozen=True)
class Prefill:
    first_token_at: float  # perf_counter seconds
    match: Match


class Engine:
    """One GPU (prefills serialized in arrival order) and the KV tiers behind it."""

    def __init__(self, profile: Profile, time_scale: float) -> None:
        self.profile = profile
        self.scale = time_scale
        self.cache = KVCache(profile.make_tiers(), profile.block_tokens)
        self._specs = {t.name: t for t in profile.tiers}
        self._gpu = asyncio.Lock()  # FIFO
        self._gpu_free_at = 0.0
        self._link_free_at = {t.name: 0.0 for t in profile.tiers}
        self.competing_bytes_per_s = 0.0  # set by kvbench's "emulated" traffic driver

    def wall(self, model_s: float) -> float:
        return model_s / self.scale

    async def prefill(self, hashes: list[int], n: int, ready: float) -> Prefill:
        async with self._gpu:
            start = max(ready, self._gpu_free_at)
            await sleep_until(start, precise=True)
            match = self.cache.lookup(hashes, n) if self.cache.tiers else Match(0, {}, 0)
            if not match.load_blocks:
                return Prefill(await self._compute(start, hashes, n, match), match)
        # The KV is loaded while the GPU serves others; the request then queues again.
        loaded_at = max(self._reserve_load(name, blocks, start) for name, blocks in match.load_blocks.items())
        await sleep_until(loaded_at, precise=True)
        async with self._gpu:
            start = max(loaded_at, self._gpu_free_at)
            return Prefill(await self._compute(start, hashes, n, match), match)

    async def _compute(self, start: float, hashes: list[int], n: int, match: Match) -> float:
        end = start + self.wall(self.profile.compute_s(n, match.cached_tokens))
        # Stored before the wait so the bookkeeping does not delay the first token; nobody can
        # look the blocks up before this request releases the GPU.
        self.cache.store(hashes, match)
        self._gpu_free_at = end
        await sleep_until(end, precise=True)
        return end

    def _reserve_load(self, tier: str, blocks: int, start: float) -> float:
        spec = self._specs[tier]
        transfer = self.wall(self.profile.load_s(spec, blocks, self.competing_bytes_per_s) - spec.latency_s)
        begin = max(start, self._link_free_at[tier])
        self._link_free_at[tier] = begin + transfer
        return begin + transfer + self.wall(spec.latency_s)


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


class Emulator:
    def __init__(
        self,
        profile: Profile,
        time_scale: float = 1.0,
        api_key: str | None = None,
        timing_log: Path | None = None,
        model: str | None = None,
        slowdown: float = 1.0,
    ) -> None:
        if time_scale <= 0 or slowdown <= 0:
            raise ValueError("time_scale and slowdown must be > 0")
        self.profile = profile
        self.model = model or profile.model_id
        # A slowdown stretches every modelled delay (a regression on purpose, to test gates).
        self.engine = Engine(profile, time_scale / slowdown)
        self.counters = Counters()
        # (first-token lateness, modelled TTFT) in model seconds, per request since the last reset
        self.late: deque[tuple[float, float]] = deque(maxlen=LATE_KEPT)
        self._api_key = api_key
        self._timing: IO[str] | None = timing_log.open("a", encoding="utf-8") if timing_log else None
        self._prompts: OrderedDict[tuple[bytes, str | None], tuple[int, list[int]]] = OrderedDict()
        self._vocab: dict[str, int] = {}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health)
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        app.router.add_get("/kvbench/lateness", self.lateness)
        app.router.add_post("/kvbench/lateness", self.lateness)
        app.router.add_get("/kvbench/traffic", self.traffic)
        app.router.add_post("/kvbench/traffic", self.traffic)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app: web.Application) -> None:
        if self._timing:
            self._timing.close()

    def _arrival(self, request: web.Request) -> float:
        """When the modelled delays start. At time scale X a fixed transport overhead of d would
        show as X*d in model time, so when the client says when it sent the request (header
        X-Kvbench-Sent-Ns: the shared monotonic clock of one host) the delays run from then.
        Only for X > 1 and a plausible value; otherwise from this handler's start."""
        now = time.perf_counter()
        sent = request.headers.get(SENT_HEADER)
        if self.engine.scale > 1 and sent and sent.isdigit():
            t = int(sent) / 1e9
            if now - 0.05 < t <= now:
                return t
        return now

    def _unauthorised(self, request: web.Request) -> web.Response | None:
        if self._api_key and request.headers.get("Authorization") != f"Bearer {self._api_key}":
            return _error(401, "Invalid or missing API key.", "AuthenticationError")
        return None

    async def _json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            obj = json.loads(await request.read())
        except ValueError:
            return _error(400, "Request body is not valid JSON.")
        return obj if isinstance(obj, dict) else _error(400, "Request body must be a JSON object.")

    def _prompt(self, text: str, salt: str | None) -> tuple[int, list[int]]:
        key = (hashlib.blake2b(text.encode(), digest_size=16).digest(), salt)
        hit = self._prompts.get(key)
        if hit is not None:
            self._prompts.move_to_end(key)
            return hit
        tokens = tokenizer.tokenize(text)
        value = (len(tokens), block_hashes(tokens, self.profile.block_tokens, salt))
        self._prompts[key] = value
        if len(self._prompts) > _PROMPT_CACHE_SIZE:
            self._prompts.popitem(last=False)
        return value

    # --- endpoints -----------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        arrived = self._arrival(request)
        if (denied := self._unauthorised(request)) is not None:
            return denied
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "'messages' must be a non-empty list.")
        return await self._generate(request, body, tokenizer.render_chat(messages), arrived, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrived = self._arrival(request)
        if (denied := self._unauthorised(request)) is not None:
            return denied
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return _error(400, "'prompt' must be a string.")
        return await self._generate(request, body, prompt, arrived, chat=False)

    async def models(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorised(request)) is not None:
            return denied
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "kvbench-emulator",
                        "max_model_len": self.profile.max_model_len,
                    }
                ],
            }
        )

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's format (`prompt`, or `messages` with the chat template) and llama.cpp's (`content`)."""
        body = await self._json(request)
        if isinstance(body, web.Response):
            return body
        if isinstance(body.get("messages"), list):
            text = tokenizer.render_chat(body["messages"], bool(body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        elif isinstance(body.get("content"), str):
            text = body["content"]
        else:
            return _error(400, "Give 'prompt', 'messages' or 'content'.")
        ids = [self._vocab.setdefault(tok, len(self._vocab)) for tok in tokenizer.tokenize(text)]
        return web.json_response({"count": len(ids), "max_model_len": self.profile.max_model_len, "tokens": ids})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(
            text=render(self.counters, self.engine.cache, self.model), content_type="text/plain", charset="utf-8"
        )

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def traffic(self, request: web.Request) -> web.Response:
        """Competing storage traffic (bytes/s) that the G4 model shares its bandwidth with."""
        if request.method == "POST":
            body = await self._json(request)
            if isinstance(body, web.Response):
                return body
            bps = body.get("bytes_per_s")
            if not isinstance(bps, int | float) or isinstance(bps, bool) or bps < 0:
                return _error(400, "'bytes_per_s' must be a number >= 0.")
            self.engine.competing_bytes_per_s = float(bps)
        g4 = next((t for t in self.profile.tiers if t.name == "G4"), None)
        return web.json_response(
            {
                "bytes_per_s": self.engine.competing_bytes_per_s,
                "g4_effective_read_bytes_per_s": g4.effective_read(self.engine.competing_bytes_per_s) if g4 else None,
            }
        )

    async def lateness(self, request: web.Request) -> web.Response:
        """How late the first tokens were against this model's own schedule, in model seconds,
        since the last POST (which starts a new count): the emulator's CPU work (tokenizing long
        prompts, block hashing) must fit inside the modelled times, or its figures are wrong."""
        if request.method == "POST":
            self.late.clear()
            return web.json_response({"requests": 0})
        late = [x for x, _ in self.late]
        share = [x / m for x, m in self.late if m > 0]
        return web.json_response(
            {
                "requests": len(late),
                "first_token_late_s": {
                    "p50": percentile(late, 50),
                    "p99": percentile(late, 99),
                    "max": max(late, default=None),
                },
                "share_of_modelled_ttft": {"p50": percentile(share, 50), "p99": percentile(share, 99)},
                "time_scale": self.engine.scale,
            }
        )

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        if (denied := self._unauthorised(request)) is not None:
            return denied
        self.engine.cache.reset()
        return web.Response(text="ok")

    # --- generation ----------------------------------------------------------------------

    def _accepted(self, body: dict[str, Any], text: str) -> web.Response | tuple[int, list[int], int]:
        """The request's prompt tokens, block hashes and max_tokens, or the error a server gives."""
        if body.get("model") not in (None, self.model):
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _error(400, "'max_tokens' must be a positive integer.")
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            return _error(400, "'cache_salt' must be a string.")
        n, hashes = self._prompt(text, salt)
        if n + max_tokens > self.profile.max_model_len:
            return _error(
                400,
                f"This model's maximum context length is {self.profile.max_model_len} tokens. "
                f"However, you requested {n + max_tokens} tokens ({n} in the messages, "
                f"{max_tokens} in the completion).",
            )
        return n, hashes, max_tokens

    async def _generate(
        self, request: web.Request, body: dict[str, Any], text: str, arrived: float, chat: bool
    ) -> web.StreamResponse:
        accepted = self._accepted(body, text)
        if isinstance(accepted, web.Response):
            return accepted
        n, hashes, max_tokens = accepted
        stream_opts = body.get("stream_options")
        include_usage = isinstance(stream_opts, dict) and bool(stream_opts.get("include_usage"))
        request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        out = _Output(self, chat, f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", n)

        resp: web.StreamResponse | None = None
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            try:
                await resp.prepare(request)
                if chat:  # as many servers do: the role arrives before any token (and is not one)
                    await resp.write(out.sse({"role": "assistant", "content": ""}, None))
            except ConnectionResetError:  # the client went away before its answer began
                self.counters.request_errors += 1
                return resp

        prefill = await self.engine.prefill(hashes, n, arrived)
        self._count_prefill(n, prefill.match)
        first_token_ns = 0
        beyond = 0.0  # the first token's lateness beyond the timer's granularity, model seconds
        try:
            for i in range(max_tokens):
                t = prefill.first_token_at + i * self.engine.wall(self.profile.itl_s)
                if i:
                    await sleep_until(t)
                if i == 0:  # stamped as its bytes go to the transport: resp.write hands them over before it yields
                    first_token_ns = time.perf_counter_ns()
                if resp is not None:
                    await resp.write(out.token_chunk(i))
                if i == 0:
                    self.counters.observe_ttft((time.perf_counter() - arrived) * self.engine.scale)
                    late_wall = max(0.0, first_token_ns / 1e9 - prefill.first_token_at)
                    self.late.append(
                        (late_wall * self.engine.scale, (prefill.first_token_at - arrived) * self.engine.scale)
                    )
                    beyond = max(0.0, late_wall - TIMER_GRANULARITY_S) * self.engine.scale
            self.counters.generation_tokens += max_tokens
            self.counters.requests += 1
            usage = {**out.usage(max_tokens, prefill.match.cached_tokens), EMULATOR_LATE_KEY: round(beyond, 6)}
            if resp is None:
                return web.json_response(out.full_response(max_tokens, usage))
            await resp.write(out.finish_chunk())
            if include_usage:
                await resp.write(out.raw({"choices": [], "usage": usage}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except ConnectionResetError:  # the client went away (e.g. Ctrl-C): nothing to answer
            self.counters.request_errors += 1
            return resp if resp is not None else web.Response(status=499)
        except asyncio.CancelledError:
            self.counters.request_errors += 1
            raise
        finally:
            self._log_timing(request_id, arrived, first_token_ns, n, prefill.match.cached_tokens)

    def _log_timing(self, request_id: str, arrived: float, first_token_ns: int, n: int, cached: int) -> None:
        """One line of the timing log (`timing_log`): when the request came, its first token went, it ended."""
        if self._timing is None:
            return
        line = {
            "request_id": request_id,
            "recv_ns": int(arrived * 1e9),
            "first_token_ns": first_token_ns or None,
            "end_ns": time.perf_counter_ns(),
            "prompt_tokens": n,
            "cached_tokens": cached,
        }
        self._timing.write(json.dumps(line) + "\n")
        self._timing.flush()

    def _count_prefill(self, n: int, match: Match) -> None:
        c = self.counters
        c.prompt_tokens += n
        c.query_tokens += n
        c.g1_hit_tokens += match.g1_blocks * self.profile.block_tokens
        c.external_hit_tokens += sum(match.load_blocks.values()) * self.profile.block_tokens


class _Output:
    """Chunks of one response, in the shapes vLLM sends."""

    def __init__(self, emu: Emulator, chat: bool, rid: str, prompt_tokens: int) -> None:
        self.emu = emu
        self.chat = chat
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if chat else "text_completion"

    def raw(self, payload: dict[str, Any]) -> bytes:
        payload = {"id": self.rid, "object": self.obj, "created": self.created, "model": self.emu.model, **payload}
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def sse(self, delta: dict[str, Any] | None, finish: str | None, text: str = "") -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if self.chat:
            choice["delta"] = delta or {}
        else:
            choice["text"] = text
        return self.raw({"choices": [choice]})

    def _word(self, i: int) -> str:
        return " " + _OUTPUT_WORDS[i % len(_OUTPUT_WORDS)]

    def _is_reasoning(self, i: int) -> bool:
        return self.chat and i < self.emu.profile.reasoning_tokens

    def token_chunk(self, i: int) -> bytes:
        word = self._word(i)
        if not self.chat:
            return self.sse(None, None, word)
        key = self.emu.profile.reasoning_field if self._is_reasoning(i) else "content"
        return self.sse({key: word}, None)

    def finish_chunk(self) -> bytes:
        return self.sse({}, "length")

    def usage(self, completion: int, cached: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }

    def full_response(self, completion: int, usage: dict[str, Any]) -> dict[str, Any]:
        words = [self._word(i) for i in range(completion)]
        base = {"id": self.rid, "created": self.created, "model": self.emu.model, "usage": usage}
        if not self.chat:
            return {
                **base,
                "object": "text_completion",
                "choices": [{"index": 0, "text": "".join(words), "finish_reason": "length"}],
            }
        reasoning = "".join(w for i, w in enumerate(words) if self._is_reasoning(i))
        content = "".join(w for i, w in enumerate(words) if not self._is_reasoning(i))
        message = {"role": "assistant", "content": content, self.emu.profile.reasoning_field: reasoning or None}
        return {
            **base,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
        }
