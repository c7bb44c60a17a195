"""ruff and mypy, as configured in pyproject.toml, are part of the test suite."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("cmd", [["ruff", "check", "."], ["mypy"]], ids=["ruff", "mypy"])
def test_clean(cmd: list[str]) -> None:
    if shutil.which(cmd[0]) is None:
        cmd = [sys.executable, "-m", *cmd]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
