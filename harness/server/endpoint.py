"""Talking to the endpoint about everything but the measured requests: URLs, the model list,
token counting for exact-length prompts, and arm hooks."""

from __future__ import annotations

import asyncio
import json
import random
import re
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from harness.config.scenario import Hook
from harness.core.errors import EndpointError, InputError
from harness.inputs import prompts
from harness.inputs.prompts import Counter

_UNITS_RE = re.compile(r"\w+|[^\w\s]")


def check_url(url: str, where: str) -> str:
    expected = f"{where}: expected an http(s) URL such as http://host:8000/v1, got {url!r}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises for a port outside 0-65535)
    except ValueError as e:  # an unclosed [IPv6 bracket, a port out of range
        raise InputError(f"{expected} ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or "\0" in url:
        raise InputError(expected)
    return url.rstrip("/")


def redact(url: str) -> str:
    """The URL without credentials or query string: safe for results, logs and reports."""
    p = urlsplit(url)
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{p.port}" if p.port else host
    return urlunsplit((p.scheme, netloc, p.path, "", ""))


def join(base: str, suffix: str) -> str:
    """`base` + path `suffix`, keeping any query string (e.g. an api-version) at the end."""
    p = urlsplit(base)
    return urlunsplit((p.scheme, p.netloc, p.path.rstrip("/") + suffix, p.query, ""))


def root(base: str) -> str:
    """Server root of an OpenAI base URL: vLLM serves /tokenize and /metrics beside /v1."""
    p = urlsplit(base)
    return urlunsplit((p.scheme, p.netloc, re.sub(r"/v1/?$", "", p.path.rstrip("/")), p.query, ""))


def within(session: aiohttp.ClientSession, total_s: float) -> aiohttp.ClientTimeout:
    """A control-plane call's own total time, keeping the session's other bounds: a ClientTimeout
    given per call replaces the session's whole, and without this a stalled TLS handshake waited
    for the call's total instead of connect_s."""
    t = session.timeout
    return aiohttp.ClientTimeout(total=total_s, connect=t.connect, sock_connect=t.sock_connect, sock_read=t.sock_read)


def failure(e: BaseException, url: str, session: aiohttp.ClientSession) -> str:
    """Why a control-plane call failed, in words: a connection or TLS handshake that did not
    complete within connect_s is named as such."""
    if isinstance(e, aiohttp.ConnectionTimeoutError) and session.timeout.sock_connect:
        tls = " or TLS handshake" if url.startswith("https://") else ""
        return f"no connection{tls} within {session.timeout.sock_connect:g} s (connect_s)"
    return str(e) or type(e).__name__


async def list_models(session: aiohttp.ClientSession, base: str, headers: dict[str, str]) -> list[str]:
    url = join(base, "/models")
    shown = redact(url)
    try:
        async with session.get(url, headers=headers, timeout=within(session, 30)) as resp:
            if resp.status in (401, 403):
                raise EndpointError(
                    f"HTTP {resp.status} from {shown}: the endpoint wants an API key; put it in OPENAI_API_KEY "
                    "(or name another variable with --api-key-env)"
                )
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:300]
                raise EndpointError(f"HTTP {resp.status} from {shown}: {text}")
            data = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise EndpointError(f"cannot reach {shown}: {failure(e, url, session)}") from None
    except ValueError:
        raise EndpointError(f"{shown} did not answer with JSON: is this an OpenAI-compatible base URL?") from None
    ids = [m.get("id") for m in data.get("data", []) if isinstance(m, dict)] if isinstance(data, dict) else []
    if not ids:
        raise EndpointError(f"{shown} lists no models")
    return [str(i) for i in ids]


def _tokenize_payload(text: str, model: str, api: str) -> dict[str, object]:
    if api == "chat":
        return {"model": model, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True}
    return {"model": model, "prompt": text}


async def server_counter(
    session: aiohttp.ClientSession, base: str, model: str, api: str, headers: dict[str, str]
) -> tuple[Counter, str] | None:
    """The server's own token count, chat template included: vLLM's POST /tokenize (`prompt` or
    `messages`), or llama.cpp's (`content`, after POST /apply-template for chat). Returns the
    counter and which server answered, or None when there is neither."""
    url = join(root(base), "/tokenize")

    async def post(target: str, payload: dict[str, object]) -> dict[str, object]:
        async with session.post(target, json=payload, headers=headers) as resp:
            if resp.status != 200:
                raise EndpointError(f"HTTP {resp.status} from {redact(target)} while counting prompt tokens")
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise EndpointError(f"{redact(target)}: unexpected answer while counting prompt tokens")
        return data

    async def vllm(text: str) -> int:
        data = await post(url, _tokenize_payload(text, model, api))
        count = data.get("count")
        return int(count) if isinstance(count, int) else len(data["tokens"])  # type: ignore[arg-type]

    async def llamacpp(text: str) -> int:
        content = text
        if api == "chat":
            templated = await post(
                join(root(base), "/apply-template"), {"messages": [{"role": "user", "content": text}]}
            )
            content = str(templated["prompt"])
        data = await post(url, {"content": content, "add_special": True, "parse_special": True})
        return len(data["tokens"])  # type: ignore[arg-type]

    for flavor, count in (("vllm", vllm), ("llama.cpp", llamacpp)):
        try:
            if await count("hello world") > 0:
                return _guarded(count, redact(url)), flavor
        except (EndpointError, aiohttp.ClientError, ValueError, KeyError, TypeError):
            continue
    return None


def _guarded(count: Counter, where: str) -> Counter:
    """A counter whose failures (a server that dies while prompts are sized) are EndpointErrors."""

    async def guarded(text: str) -> int:
        try:
            return await count(text)
        except EndpointError:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError) as e:
            raise EndpointError(f"counting prompt tokens at {where}: {str(e) or type(e).__name__}") from None

    return guarded


async def usage_counter(
    session: aiohttp.ClientSession, base: str, model: str, api: str, headers: dict[str, str]
) -> Counter:
    """An estimate calibrated on `usage.prompt_tokens` of two probe requests. The probes carry a
    lead of their own, so they warm nothing that the run will later measure as cold."""
    path = "/chat/completions" if api == "chat" else "/completions"
    points: list[tuple[int, int]] = []
    salt = random.randrange(10**prompts.LEAD_DIGITS)
    for words in (400, 1600):
        text = (
            prompts.lead(salt + words)
            + "[kvbench calibration] "
            + " ".join(prompts.body_words(salt, "calibration", words))
        )
        body: dict[str, object] = {"model": model, "max_tokens": 1, "stream": False}
        if api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        try:
            async with session.post(join(base, path), json=body, headers=headers) as resp:
                data = await resp.json(content_type=None) if resp.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, OSError) as e:  # a broken answer too (ClientResponseError)
            why = getattr(e, "message", None) or str(e) or type(e).__name__
            raise EndpointError(f"calibrating prompt lengths at {redact(base)}{path}: {why}") from None
        except ValueError:
            raise EndpointError(f"{redact(base)}{path} did not answer the calibration request with JSON") from None
        n = (data.get("usage") or {}).get("prompt_tokens") if isinstance(data, dict) else None
        if not isinstance(n, int):
            raise EndpointError(
                f"{redact(base)} has no /tokenize and reports no usage.prompt_tokens: cannot size prompts"
            )
        points.append((len(_UNITS_RE.findall(text)), n))
    (u1, n1), (u2, n2) = points
    ratio = (n2 - n1) / (u2 - u1)
    offset = n1 - ratio * u1

    async def count(text: str) -> int:
        # the line through the probes may cross zero before the empty text (the offset, the chat
        # template's tokens, came out at -8 on Dynamo): no text has fewer than none
        return max(0, round(offset + ratio * len(_UNITS_RE.findall(text))))

    return count


async def run_hook(hook: Hook, arm: str, base: str, session: aiohttp.ClientSession, headers: dict[str, str]) -> str:
    """Run an arm's `before` hook; returns what it did, raises EndpointError when it fails."""
    if hook.http:
        method, target = hook.http.split(" ", 1)
        url = target if target.startswith(("http://", "https://")) else join(root(base), target)
        try:
            async with session.request(method, url, headers=headers, timeout=within(session, 120)) as resp:
                text = (await resp.text(errors="replace"))[:300]
                if resp.status >= 300:
                    raise EndpointError(f"arm {arm}: before hook {method} {redact(url)}: HTTP {resp.status}: {text}")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            why = failure(e, url, session)
            raise EndpointError(f"arm {arm}: before hook {method} {redact(url)}: {why}") from None
        return f"{method} {redact(url)}"
    assert hook.command is not None
    try:
        proc = await asyncio.create_subprocess_exec(
            *hook.command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        _, err = await asyncio.wait_for(proc.communicate(), timeout=600)
    except (OSError, TimeoutError) as e:
        raise EndpointError(f"arm {arm}: before hook {json.dumps(list(hook.command))}: {e}") from None
    if proc.returncode != 0:
        tail = err.decode("utf-8", "replace").strip()[-500:]
        raise EndpointError(
            f"arm {arm}: before hook {json.dumps(list(hook.command))} exited with {proc.returncode}: {tail}"
        )
    return "command " + json.dumps(list(hook.command))
