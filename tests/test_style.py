"""The tree is ruff clean, lint and format, with the settings in pyproject.toml: what a contributor's
editor and CI agree on. A failure prints ruff's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ci_support import need_module

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_is_clean(command: list[str]) -> None:
    need_module("ruff", "pip install -e '.[dev]'")
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
