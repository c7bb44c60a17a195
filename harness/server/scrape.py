"""Scraping the server's Prometheus endpoint(s) around each phase of a run (see metrics.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from harness.core.clock import ModelClock
from harness.core.errors import write_file
from harness.results import RequestRecord, Table
from harness.server import metrics
from harness.server.checks import HIGH_COLD_HIT_RATIO, LOW_WARM_HIT_RATIO
from harness.server.endpoint import redact, within

# the label a sample from one of several same-named sources (Scraper's `sources`) carries
SOURCE_LABEL = "kvbench_source"


@dataclass
class Phase:
    deltas: metrics.Snapshot = field(default_factory=dict)
    requests: int = 0
    prompt_tokens: int = 0
    client_ttft: list[np.ndarray] = field(default_factory=list)  # each recorded batch's, in order


class Scraper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        urls: list[str],
        headers: dict[str, str],
        sources: dict[str, str] | None = None,
    ) -> None:
        """`sources`: URLs whose samples get a `kvbench_source` label of the name given, so that
        several processes serving the same metric names (an engine's workers) add up instead of
        one replacing another."""
        self.session = session
        self.urls = urls
        self.headers = headers
        self.sources = sources or {}
        self.gauges: set[str] = set()
        self.failed: dict[str, str] = {}
        self.phases: dict[str, Phase] = {}
        self.timeline: list[dict[str, Any]] = []

    async def snapshot(self) -> metrics.Snapshot | None:
        snap: metrics.Snapshot = {}
        ok = False
        for url in self.urls:
            if url in self.failed:
                continue
            try:
                async with self.session.get(url, headers=self.headers, timeout=within(self.session, 10)) as r:
                    if r.status != 200:
                        self.failed[url] = f"HTTP {r.status}"
                        continue
                    text = await r.text()
                s, g = metrics.parse(text)
                if (source := self.sources.get(url)) is not None:
                    s = {(n, tuple(sorted((*labels, (SOURCE_LABEL, source))))): v for (n, labels), v in s.items()}
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                self.failed[url] = f"{type(e).__name__}: {e}"
                continue
            self.gauges |= g
            # Several endpoints (e.g. vLLM and Dynamo KVBM): one namespace, distinct metric names.
            snap.update(s)
            ok = True
        return snap if ok else None

    def record(
        self,
        phase: str,
        before: metrics.Snapshot | None,
        after: metrics.Snapshot | None,
        records: Iterable[RequestRecord],
    ) -> None:
        p = self.phases.setdefault(phase, Phase())
        if before is not None and after is not None:
            metrics.add(p.deltas, metrics.delta(before, after, self.gauges), self.gauges)
        t = Table.of(records)
        p.requests += len(t)
        p.prompt_tokens += int(np.nansum(t.numbers("prompt_tokens")))
        ttft = t.numbers("ttft_s")[t.ok]
        p.client_ttft.append(ttft[~np.isnan(ttft)])

    async def sample_every(self, interval_s: float, clock: ModelClock) -> None:
        """A snapshot every `interval_s` model seconds, placed on the arm's time line."""
        while True:
            await asyncio.sleep(clock.wall_s(interval_s))
            snap = await self.snapshot()
            if snap is not None:
                self.timeline.append({"t_s": clock.at_mono(time.monotonic()), "values": metrics.as_json(snap)})

    def summary(self) -> tuple[dict[str, Any], list[str]]:
        warnings: list[str] = []
        phases: dict[str, Any] = {}
        for name, p in self.phases.items():
            m = metrics.mapped(p.deltas, p.prompt_tokens)
            ratio = metrics.hit_ratio(m)
            ttft = np.concatenate(p.client_ttft).tolist() if p.client_ttft else []
            client_mean = sum(ttft) / len(ttft) if ttft else None
            server_mean = m.get("server_ttft_mean_s")
            phases[name] = {
                "requests": p.requests,
                "prompt_tokens_sent": p.prompt_tokens,
                "server_hit_ratio": ratio,
                "mapped": m,
                "client_ttft_mean_s": client_mean,
                "server_ttft_mean_s": server_mean,
                "client_minus_server_ttft_s": client_mean - server_mean
                if client_mean is not None and server_mean is not None
                else None,
                "raw_deltas": metrics.as_json(p.deltas),
            }
            if name == "warm" and ratio is not None and ratio < LOW_WARM_HIT_RATIO:
                warnings.append(
                    f"the server's own counters say warm requests mostly missed the cache (hit ratio {ratio:.0%}): "
                    "warm TTFTs here are not cached TTFTs"
                )
            if name == "cold" and ratio is not None and ratio > HIGH_COLD_HIT_RATIO:
                warnings.append(f"the server's counters report a {ratio:.0%} cache hit ratio for cold requests")
        verdict = None
        if "warm" in phases and phases["warm"]["server_hit_ratio"] is not None:
            r = phases["warm"]["server_hit_ratio"]
            verdict = (
                f"warm requests hit the cache: server-side hit ratio {r:.0%}"
                if r >= LOW_WARM_HIT_RATIO
                else f"warm requests did NOT hit the cache: server-side hit ratio {r:.0%}"
            )
        doc = {
            "schema_version": 1,
            "urls": [redact(u) for u in self.urls],
            "unreachable": {redact(u): why for u, why in self.failed.items()},
            "phases": phases,
            "verdict": verdict,
        }
        return doc, warnings

    def write(self, folder: Path) -> tuple[dict[str, Any], list[str]]:
        doc, warnings = self.summary()
        doc["warnings"] = warnings
        write_file(folder / "metrics.json", json.dumps(doc, indent=1) + "\n")
        if self.timeline:
            write_file(folder / "metrics-timeline.jsonl", "".join(json.dumps(row) + "\n" for row in self.timeline))
        return doc, warnings
