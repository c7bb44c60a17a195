"""The escape hatch (`[endpoint] transport = "aiohttp"`): streamed requests through aiohttp's
public client API, for a server kvbench's own transport cannot talk to. The same records, the
same timeouts and error kinds; response bytes are stamped when aiohttp hands them over
(`parse-time`), which can be late under load, and aiohttp keeps its own connection pool (no
`Connection: close` habit learnt, no probation of kept-alive connections).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import aiohttp

from harness.core.clock import SENT_HEADER
from harness.wire.connection import (
    ONE_PER_REQUEST,
    UNREADABLE,
    BrokenFraming,
    ConnectFailed,
    CutShort,
    Disconnected,
    IdleTimeout,
    unreadable,
)
from harness.wire.response import TooManyTokens, too_many
from harness.wire.sse import SSEDecoder, SSELimitError
from harness.wire.transport import PARSE_TIME, TooLong
from harness.wire.turns import Turns

if TYPE_CHECKING:
    from harness.wire.client import Exchange

FEED_BYTES = 8192  # bytes decoded into SSE events at once, between two looks at the turn's budget


class Aiohttp:
    name = "aiohttp"
    stamping = PARSE_TIME
    connections = ONE_PER_REQUEST  # (force_close below)

    def __init__(
        self, limit: int, connect_s: float, idle_s: float, max_line_bytes: int, send_clock: bool, turns: Turns
    ) -> None:
        self.turns = turns
        self.idle_s, self.max_line_bytes = idle_s, max_line_bytes
        self.send_clock = send_clock
        self.headers: dict[str, str] = {}
        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(self._on_chunk_sent)
        self.session = aiohttp.ClientSession(
            # A connection per request: aiohttp reads bytes a server sends after a response's end, on
            # a kept-alive connection, as the next request's answer, and gives no public way to drop
            # such a connection (kvbench's transport drops it); so none is kept (issue 56).
            connector=aiohttp.TCPConnector(limit=limit, limit_per_host=0, force_close=True),
            trace_configs=[trace],
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=idle_s),
            read_bufsize=1 << 20,
            auto_decompress=False,
        )

    async def _on_chunk_sent(
        self, _session: aiohttp.ClientSession, ctx: Any, _params: aiohttp.TraceRequestChunkSentParams
    ) -> None:
        # aiohttp writes the headers with the body's first chunk: the request leaves now.
        ex = ctx.trace_request_ctx
        if ex is not None and not ex.written:
            ex.written = True
            ex.start_ns = time.perf_counter_ns()
            self.turns.written()

    async def exchange(self, url: str, body: bytes, request_id: str, ex: Exchange, first_token_by: int | None) -> None:
        headers = {**self.headers, "X-Request-Id": request_id}
        if self.send_clock:
            headers[SENT_HEADER] = str(ex.start_ns)
        loop = asyncio.get_running_loop()
        by = None if first_token_by is None else loop.time() + (first_token_by - time.perf_counter_ns()) / 1e9
        async with asyncio.timeout_at(by) as deadline:  # the first token's (the total is the caller's)
            await self._post(url, body, headers, ex, deadline)

    async def _post(
        self, url: str, body: bytes, headers: dict[str, str], ex: Exchange, deadline: asyncio.Timeout
    ) -> None:
        try:
            async with self.session.post(url, data=body, headers=headers, trace_request_ctx=ex) as resp:
                ex.headers_ns = ex.last_read_ns = time.perf_counter_ns()
                ex.http_status = resp.status
                if resp.status != 200:
                    text = (await resp.content.read(65536)).decode("utf-8", "replace")
                    ex.error, ex.error_kind = f"HTTP {resp.status}: {text.strip()}", "http"
                    return
                await self._read(resp, ex, deadline)
        except (aiohttp.ConnectionTimeoutError, aiohttp.ClientConnectorError) as e:
            raise ConnectFailed(f"connection failed: {e}") from e
        except aiohttp.ServerTimeoutError as e:
            raise IdleTimeout(f"timeout: no data for {self.idle_s:g} s (idle_s)") from e
        except SSELimitError as e:
            raise BrokenFraming(f"protocol: {e}") from e
        except TooManyTokens as e:
            raise TooLong(f"too long: {e}") from e
        except aiohttp.ClientPayloadError as e:
            raise CutShort(f"response cut short: {e}") from e
        except aiohttp.ClientResponseError as e:  # aiohttp's parser refused the response
            raise BrokenFraming(f"protocol: {e.message}") from e
        except (aiohttp.ClientError, ConnectionError) as e:
            error = Disconnected if ex.http_status is None else CutShort
            raise error(f"{type(e).__name__}: {e}") from e
        except UNREADABLE as e:  # held to kvbench's transport's rule: this request fails, not the run
            raise BrokenFraming(unreadable(e)) from None

    async def _read(self, resp: aiohttp.ClientResponse, ex: Exchange, deadline: asyncio.Timeout) -> None:
        state = ex.state
        decoder = SSEDecoder(self.max_line_bytes, skip=state.run_end)
        async for chunk in resp.content.iter_any():
            t = ex.last_read_ns = time.perf_counter_ns()
            state.on_bytes(t)
            for cut in range(0, len(chunk), FEED_BYTES):  # a read can be 1 MB: split the work
                events = decoder.feed(chunk[cut : cut + FEED_BYTES])
                if events:
                    if self.turns.spent():
                        await self.turns.wait()
                    state.on_events(events, t)
            if len(state.token_chunk_ns) > ex.token_limit:
                raise TooManyTokens(too_many(ex.token_limit))
            if state.first_token_ns is not None and deadline.when() is not None:
                deadline.reschedule(None)
            if state.done or state.error:
                break
        else:
            state.on_events(decoder.close(), time.perf_counter_ns())

    async def open_idle(self, url: str, n: int) -> int:
        return 0  # aiohttp opens connections as requests need them

    async def close(self) -> None:
        await self.session.close()
