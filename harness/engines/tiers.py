"""Where a warm request finds its KV when an arm says it is not where the engine left it
(`[[arms]] warm_from`): a step before each warm request puts it there, through the engine's own
API, and what the engine reports of that step goes into the warm request's record.

- `"host"`: after the cold request, and before each warm one, another short prompt takes the
  slot; the engine's host-memory prompt cache (llama.cpp `--cache-ram`) brings the prompt back
  when the warm request asks for it. The warm request's cached tokens say whether it did.
- `"disk"`: the slot is saved to a file once after the cold request; before each warm request
  the slot is erased, the file dropped from the page cache (when kvbench sees the engine's slot
  directory: `slot_dir`) and restored. Its record carries the engine's restore figures: tokens
  and bytes read, and the restore's time, which the warm request's TTFT does not include.

In a closed loop (`"disk"` only) each connection keeps to a slot of its own: a prompt's first
request is computed and its slot saved to the prompt's file; every later request of that prompt
has the file restored into its connection's slot first.

Adapters per engine: llama.cpp (`/slots/{id}?action=save|restore|erase`, requests pinned to a
slot with `id_slot`). Another engine with a save and restore API is one more adapter class.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from harness.core.errors import EndpointError
from harness.server import endpoint
from harness.traffic import fio

if TYPE_CHECKING:
    from harness.config.scenario import Arm

LLAMACPP_SLOT = 0  # the slot a tiered sweep's requests go to (a closed loop's connection n: slot n)
PUSH_OUT_TOKENS = 64  # the other prompt that takes the slot ("host"): short, of its own text
STEP_TIMEOUT_S = 600.0  # a save or restore of a long prompt from a slow disk


@dataclass(frozen=True)
class Restore:
    """What the engine reported of the step before a warm request (None: it says nothing)."""

    tokens: int | None = None
    bytes: int | None = None
    seconds: float | None = None

    def fields(self, warm_from: str) -> dict[str, Any]:
        return {
            "warm_from": warm_from,
            "restore_tokens": self.tokens,
            "restore_bytes": self.bytes,
            "restore_s": self.seconds,
        }


class Adapter(Protocol):
    """An engine's way to put a prompt's KV in a tier, around its requests on one of the
    engine's slots (a sweep uses slot 0; a closed loop's connection n, slot n); `body_fields`
    go into every request sent on that slot."""

    def body_fields(self, slot: int = 0) -> dict[str, Any]: ...

    async def check_slots(self, needed: int) -> None: ...

    def saved_file(self, prompt_id: str) -> bool: ...

    async def after_cold(self, prompt_id: str, slot: int = 0) -> None: ...

    async def before_warm(self, prompt_id: str, slot: int = 0) -> Restore: ...

    async def finish(self) -> dict[str, Any]: ...


def page_cache_note(slot_dir: Path | None) -> str:
    return (
        "dropped before each restore (posix_fadvise DONTNEED on the slot file)"
        if slot_dir is not None
        else "not dropped (no slot_dir: kvbench cannot see the engine's files): restores may come from memory"
    )


class LlamaCpp:
    """llama.cpp's llama-server: its slot API and its host-memory prompt cache."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        warm_from: str,
        run_id: str,
        slot_dir: str | None,
        push_out_text: str,
    ) -> None:
        self.session, self.root = session, endpoint.root(base_url)
        self.warm_from, self.run_id = warm_from, run_id
        self.slot_dir = Path(slot_dir) if slot_dir is not None else None
        self.push_out_text = push_out_text
        self.saved: list[dict[str, Any]] = []  # what each save reported
        self.files: dict[str, asyncio.Lock] = {}  # saved files: a restore never reads one being written
        self.slots_used: set[int] = set()

    def body_fields(self, slot: int = LLAMACPP_SLOT) -> dict[str, Any]:
        self.slots_used.add(slot)
        return {"id_slot": slot}

    async def check_slots(self, needed: int) -> None:
        """Each connection keeps to a slot of its own: the engine needs that many."""
        url = endpoint.join(self.root, "/props")
        try:
            async with self.session.get(url, timeout=endpoint.within(self.session, 30)) as r:
                got = await r.json(content_type=None) if r.status == 200 else {}
        except (aiohttp.ClientError, TimeoutError, ValueError):
            got = {}
        total = got.get("total_slots") if isinstance(got, dict) else None
        if isinstance(total, int) and total < needed:
            raise EndpointError(
                f"warm_from = {self.warm_from}: {needed} connections need as many llama.cpp slots, "
                f"the engine has {total} (start it with -np {needed}, or [engine] slots = {needed})"
            )

    def _file(self, prompt_id: str) -> str:
        """The name of a prompt's slot file (in the engine's --slot-save-path)."""
        return f"kvbench-{self.run_id}-{prompt_id}.bin"

    def saved_file(self, prompt_id: str) -> bool:
        return self._file(prompt_id) in self.files

    async def after_cold(self, prompt_id: str, slot: int = LLAMACPP_SLOT) -> None:
        if self.warm_from != "disk":
            return
        name = self._file(prompt_id)
        lock = self.files.setdefault(name, asyncio.Lock())
        async with lock:
            got = await self._slots("save", slot, name)
        self.saved.append(
            {
                "prompt_id": prompt_id,
                "slot": slot,
                "tokens": _int(got.get("n_saved")),
                "bytes": _int(got.get("n_written")),
                "seconds": _ms(got.get("timings"), "save_ms"),
            }
        )

    async def before_warm(self, prompt_id: str, slot: int = LLAMACPP_SLOT) -> Restore:
        if self.warm_from == "host":
            await self._push_out()
            return Restore()
        name = self._file(prompt_id)
        await self._slots("erase", slot)
        async with self.files.setdefault(name, asyncio.Lock()):
            if self.slot_dir is not None:
                drop_from_page_cache(self.slot_dir / name)
            got = await self._slots("restore", slot, name)
        return Restore(_int(got.get("n_restored")), _int(got.get("n_read")), _ms(got.get("timings"), "restore_ms"))

    async def finish(self) -> dict[str, Any]:
        """run.json's `tiers`; the slot files are removed where kvbench sees them."""
        if self.slot_dir is not None:
            for name in self.files:
                (self.slot_dir / name).unlink(missing_ok=True)
        out: dict[str, Any] = {"engine": "llama.cpp", "warm_from": self.warm_from, "slots": sorted(self.slots_used)}
        if self.warm_from == "disk":
            out |= {"saves": self.saved, "page_cache": page_cache_note(self.slot_dir)}
            if self.slot_dir is not None and self.saved:  # the device the restores read, as fio sees it
                out["fio_read"] = await asyncio.to_thread(fio.read_probe, self.slot_dir)
        else:
            out["push_out_tokens"] = PUSH_OUT_TOKENS
        return out

    async def _push_out(self) -> None:
        body = {"prompt": self.push_out_text, "n_predict": 1, "id_slot": LLAMACPP_SLOT, "cache_prompt": True}
        await self._post(endpoint.join(self.root, "/completion"), body, "push the prompt out of its slot")

    async def _slots(self, action: str, slot: int, filename: str | None = None) -> dict[str, Any]:
        url = endpoint.join(self.root, f"/slots/{slot}?action={action}")
        body = {"filename": filename} if filename else {}
        hint = " (llama-server saves slots only when started with --slot-save-path DIR)"
        return await self._post(url, body, f"{action} slot {slot}", hint)

    async def _post(self, url: str, body: dict[str, Any], what: str, hint: str = "") -> dict[str, Any]:
        said = f"warm_from = {self.warm_from}: the engine could not {what}"
        try:
            async with self.session.post(url, json=body, timeout=endpoint.within(self.session, STEP_TIMEOUT_S)) as r:
                text = await r.text()
                if r.status != 200:
                    raise EndpointError(f"{said}: HTTP {r.status} {text[:300]}{hint}")
                got = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise EndpointError(f"{said}: {str(e) or type(e).__name__}") from None
        return got if isinstance(got, dict) else {}


def drop_from_page_cache(path: Path) -> None:
    """The file's pages written back and dropped, so that the restore reads the device."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise EndpointError(
            f"slot_dir: cannot open the engine's slot file {path}: {e.strerror or e} "
            "(is slot_dir the engine's --slot-save-path, as this machine sees it?)"
        ) from None
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def adapter(
    arm: Arm, server: str, base_url: str, run_id: str, session: aiohttp.ClientSession, push_out_text: str
) -> Adapter:
    """The adapter an arm's `warm_from` (not "active") needs on `server` (the engine it looks like)."""
    if server != "llama.cpp":
        raise EndpointError(
            f"arm {arm.name}: warm_from = {arm.warm_from} needs an engine kvbench can move KV on; "
            f"llama.cpp is the one it knows (this endpoint looks like {server})"
        )
    return LlamaCpp(session, base_url, arm.warm_from, run_id, arm.slot_dir, push_out_text)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _ms(timings: Any, key: str) -> float | None:
    v = timings.get(key) if isinstance(timings, dict) else None
    return round(v / 1000, 6) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
