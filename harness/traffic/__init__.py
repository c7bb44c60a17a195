"""Competing storage I/O during a run: fio (locally or across `fio --server` hosts), a builtin
Python generator, any command, or the embedded emulator's model of it.

Every driver starts before the measured phase and stops when it ends (or on Ctrl-C or failure),
cleans up what it wrote, and never writes outside its own folder inside `directory`."""

from __future__ import annotations

from pathlib import Path

from harness.config.traffic import TrafficCfg
from harness.core.clock import ModelClock
from harness.traffic.base import TrafficDriver


def make_driver(cfg: TrafficCfg, folder: Path, run_name: str, base_url: str, clock: ModelClock) -> TrafficDriver:
    from harness.traffic.builtin import BuiltinDriver
    from harness.traffic.command import CommandDriver
    from harness.traffic.emulated import EmulatedDriver
    from harness.traffic.fio import FioDriver

    if cfg.tool == "fio":
        return FioDriver(cfg, folder, run_name)
    if cfg.tool == "builtin":
        return BuiltinDriver(cfg, folder, run_name)
    if cfg.tool == "command":
        return CommandDriver(cfg, folder, run_name)
    return EmulatedDriver(cfg, base_url, clock)
