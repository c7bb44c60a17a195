"""A real browser for report tests: Debian's chromium, headless, driven over the DevTools
protocol (the `browser` fixture gives its DevTools host; conftest.py makes it every test's)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser() -> Iterator[str]:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (.ci/run installs it with apt-get)")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stderr is not None
        drain = threading.Thread(target=proc.stderr.read, daemon=True)
        try:
            for line in proc.stderr:
                if m := re.search(r"DevTools listening on ws://([\d.]+:\d+)/", line):
                    # Keep draining its log so chromium never blocks on a full pipe.
                    drain.start()
                    yield m.group(1)
                    break
            else:
                pytest.fail("chromium did not start its DevTools endpoint")
        finally:
            proc.kill()
            proc.wait()
            if drain.is_alive():
                drain.join(timeout=10)
            proc.stderr.close()


async def inspect_page(host: str, url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.put(f"http://{host}/json/new?about:blank") as r:
            target = await r.json(content_type=None)
        async with s.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            seq = 0
            events: list[dict[str, Any]] = []

            async def call(method: str, **params: Any) -> dict[str, Any]:
                nonlocal seq
                seq += 1
                await ws.send_json({"id": seq, "method": method, "params": params})
                async for msg in ws:
                    data = json.loads(msg.data)
                    if data.get("id") == seq:
                        return data.get("result", {})
                    events.append(data)
                raise AssertionError("DevTools connection closed")

            for domain in ("Page", "Network", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            while not any(e.get("method") == "Page.loadEventFired" for e in events):
                events.append(json.loads((await ws.receive(timeout=30)).data))
            sizes = await call(
                "Runtime.evaluate",
                returnByValue=True,
                expression=(
                    "Array.from(document.querySelectorAll('figure svg')).map(s => {"
                    "const r = s.getBoundingClientRect(); return [r.width, r.height]; })"
                ),
            )
            shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            return {"events": events, "sizes": sizes["result"]["value"], "png": base64.b64decode(shot["data"])}


def assert_clean(got: dict[str, Any], page: Path) -> None:
    """The page loaded nothing but itself, and logged no error or exception."""
    requests = [e["params"]["request"]["url"] for e in got["events"] if e.get("method") == "Network.requestWillBeSent"]
    assert requests == [page.as_uri()]  # the page itself, nothing else
    problems = [
        e
        for e in got["events"]
        if e.get("method") in ("Runtime.exceptionThrown", "Runtime.consoleAPICalled")
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    assert problems == []
