"""What every traffic driver shares: the safety rules for directories, and the result files."""

from __future__ import annotations

import json
import shutil
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from harness.config.traffic import TrafficCfg, check_traffic_directory
from harness.core.children import stop_group
from harness.core.clock import ModelClock
from harness.core.errors import InputError, write_file
from harness.core.units import human_bandwidth

# Below this share of the target the run did not apply the load it claims.
ACHIEVED_WARN_SHARE = 0.9


def prepare_directory(directory: str, allow_nonempty: bool, run_name: str) -> tuple[Path, list[Path]]:
    """Check `directory` and make kvbench's own working folder inside it. Returns (working
    folder, the folders kvbench created for `directory`, deepest first, so they can be removed)."""
    check_traffic_directory(directory, "traffic.directory")
    raw = Path(directory)
    if not raw.is_absolute():
        raw = Path.cwd() / raw
    path = raw.resolve()  # links resolved: the same rules for where it really points
    check_traffic_directory(str(path), "traffic.directory")
    created: list[Path] = []
    if path.exists():
        mode = path.stat().st_mode
        if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
            raise InputError(f"traffic.directory: refusing {directory!r}: a device, not a directory")
        if not path.is_dir():
            raise InputError(f"traffic.directory: {directory!r} is not a directory")
        if any(path.iterdir()) and not allow_nonempty:
            raise InputError(
                f"traffic.directory: {directory!r} is not empty and kvbench did not create it; point it at an "
                "empty folder on the storage under test, or set traffic.allow_nonempty_directory = true "
                "(kvbench then works only inside a folder of its own there)"
            )
    else:
        created = [p for p in (path, *path.parents) if not p.exists()]
        path.mkdir(parents=True)
    work = path / f"kvbench-traffic-{run_name}"
    work.mkdir()
    return work, created


def cleanup_directory(work: Path, created: list[Path]) -> None:
    shutil.rmtree(work, ignore_errors=True)
    for folder in created:  # deepest first, and only if empty: never anything kvbench did not write
        try:
            folder.rmdir()
        except OSError:
            return


@dataclass
class TrafficResult:
    tool: str
    settings: dict[str, Any]
    target_bytes_per_s: float | None
    timeline: list[dict[str, Any]] = field(default_factory=list)  # t_s, client, read_bps, write_bps
    totals: dict[str, dict[str, float]] = field(default_factory=dict)  # client -> read/write bytes, seconds
    warnings: list[str] = field(default_factory=list)
    emulated: bool = False
    note: str = ""

    def achieved_bytes_per_s(self) -> float | None:
        """Mean aggregate rate over the seconds all clients ran (from the per-second timeline)."""
        if not self.timeline:
            return None
        per_t: dict[float, float] = {}
        for row in self.timeline:
            per_t[row["t_s"]] = per_t.get(row["t_s"], 0.0) + row["read_bps"] + row["write_bps"]
        return sum(per_t.values()) / len(per_t)

    def check(self) -> str | None:
        got = self.achieved_bytes_per_s()
        if self.target_bytes_per_s and got is not None and got < ACHIEVED_WARN_SHARE * self.target_bytes_per_s:
            target = human_bandwidth(self.target_bytes_per_s)
            return (
                f"competing traffic reached only {human_bandwidth(got)} of the {target}"
                f" target ({got / self.target_bytes_per_s:.0%}): this run did not apply the load it claims "
                "(add clients or jobs, or lower the target)"
            )
        return None

    def write(self, folder: Path) -> None:
        achieved = self.achieved_bytes_per_s()
        doc = {
            "schema_version": 1,
            "tool": self.tool,
            "emulated": self.emulated,
            "settings": self.settings,
            "target_bytes_per_s": self.target_bytes_per_s,
            "achieved_bytes_per_s": achieved,
            "achieved_share": achieved / self.target_bytes_per_s if achieved and self.target_bytes_per_s else None,
            "per_client": self.totals,
            "warnings": self.warnings,
            "note": self.note,
        }
        write_file(folder / "traffic.json", json.dumps(doc, indent=1) + "\n")
        write_file(folder / "traffic.jsonl", "".join(json.dumps(row) + "\n" for row in self.timeline))


class TrafficDriver(Protocol):
    async def start(self) -> None: ...

    async def stop(self, clock: ModelClock) -> TrafficResult:
        """Stop the load (idempotent enough to call on any exit path) and say what it achieved.
        Timeline times are model seconds since the arm's start (`clock`)."""
        ...


def settings_of(cfg: TrafficCfg) -> dict[str, Any]:
    d = {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    d["clients"] = list(cfg.clients)
    d["command"] = list(cfg.command) if cfg.command else None
    return d


def stop_process(proc: Any, grace_s: float = 10.0) -> None:
    """SIGINT (fio then writes its final statistics), then SIGTERM, then SIGKILL, to its group."""
    stop_group(proc, ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)))
