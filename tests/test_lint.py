"""ruff and mypy, as configured in pyproject.toml, are part of the test suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [["ruff", "check", "."], ["mypy"]], ids=["ruff", "mypy"])
def test_clean(cmd: list[str]) -> None:
    if shutil.which(cmd[0]) is None:
        cmd = [sys.executable, "-m", *cmd]
    env = dict(os.environ)
    if cmd[-1] == "mypy":
        # the user's cache folder, not the checkout's: what mypy learnt of the installed packages'
        # types (most of its time in a fresh clone) is reused by every clone; kvbench's own
        # modules are checked again wherever their files differ from what the cache saw
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench" / "mypy"
        env.setdefault("MYPY_CACHE_DIR", str(cache))
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
