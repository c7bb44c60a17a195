"""The one seam between kvbench's clock and aiohttp's internals.

Stamping bytes as the loop reads the socket (arrivals.py) needs aiohttp internals that are not
public API: its response protocol class (`ResponseHandler`, with `_reading_paused` and
`_payload`), the connector's protocol factory and loop (`TCPConnector._factory`, `._loop`) and
the response's protocol (`ClientResponse._protocol`). pyproject bounds aiohttp to the versions
the tests cover; should one of these still go missing, the client does not break: it stamps
bytes when it parses them instead, says so, and records `client_health.stamping`.

Merging a read's HTTP chunks into one piece of the response body (arrivals.merge_chunks) uses
the body reader's `_buffer` and `_http_chunk_splits`; without them each chunk is read apart, as
aiohttp does (slower, the same records).

Opening an open loop's connections ahead (client.StreamingClient.open_idle) uses aiohttp's
low-level public API, `ClientRequest` and `BaseConnector.connect`; should it change, connections
open as requests need them, as before. kvbench's own exchange (direct.py) takes its connections
through the same API, on the stamped protocol: without the handler internals, streams go through
aiohttp.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from typing import Any

# client_health.stamping: where the time of a response byte is taken
SOCKET_READ = "socket-read"
PARSE_TIME = "parse-time"

# The name of the request header that tells the embedded emulator when a request left, so that
# at a time scale X its modelled delays start from the send time (see emulator/server.py).
SENT_HEADER = "X-Kvbench-Sent-Ns"

_HANDLER_METHODS = ("data_received", "resume_reading", "eof_received", "connection_lost")
_HANDLER_ATTRS = ("_reading_paused", "_payload", "transport")
_CONNECTOR_ATTRS = ("_factory", "_loop")
_READER_ATTRS = ("_buffer", "_http_chunk_splits")


@functools.cache
def missing_handler_internals() -> tuple[str, ...]:
    """The internals of aiohttp's response protocol that are not there (checked once)."""
    try:
        from aiohttp.client_proto import ResponseHandler
    except ImportError:
        return ("aiohttp.client_proto.ResponseHandler",)
    gone = [f"ResponseHandler.{m}" for m in _HANDLER_METHODS if not callable(getattr(ResponseHandler, m, None))]
    loop = asyncio.new_event_loop()
    try:
        handler = ResponseHandler(loop)
        gone += [f"ResponseHandler.{a}" for a in _HANDLER_ATTRS if not hasattr(handler, a)]
    except Exception as e:  # any failure to build one is a changed internal
        gone.append(f"ResponseHandler(loop): {type(e).__name__}")
    finally:
        loop.close()
    return tuple(gone)


@functools.cache
def missing_reader_internals() -> tuple[str, ...]:
    """The internals of aiohttp's body reader that chunk merging needs and that are not there."""
    from aiohttp import StreamReader

    loop = asyncio.new_event_loop()
    try:
        reader = StreamReader(protocol=None, limit=1 << 16, loop=loop)  # type: ignore[arg-type]
        gone = [f"StreamReader.{a}" for a in _READER_ATTRS if not hasattr(reader, a)]
        if not gone and not isinstance(reader._buffer, collections.deque):
            gone.append("StreamReader._buffer (a deque)")
    except Exception as e:  # any failure to build one is a changed internal
        gone = [f"StreamReader(...): {type(e).__name__}"]
    finally:
        loop.close()
    return tuple(gone)


def missing_connector_internals(conn: Any) -> tuple[str, ...]:
    return tuple(f"TCPConnector.{a}" for a in _CONNECTOR_ATTRS if not hasattr(conn, a))


def warning(gone: tuple[str, ...]) -> str:
    import aiohttp

    return (
        f"aiohttp {aiohttp.__version__} lacks internals kvbench stamps socket reads through "
        f"({', '.join(gone)}): response bytes are stamped when parsed, which can be late under load; "
        "install the aiohttp version pyproject.toml names"
    )
