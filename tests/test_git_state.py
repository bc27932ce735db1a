"""The run's git state is read from the repository CMD runs in, whatever bytes its names hold."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpuledger.recorder import metadata
from gpuledger.recorder.session import os_text

GIT = shutil.which("git")


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_a_branch_named_in_latin_1_is_recorded_with_an_escape_not_an_error(tmp_path: Path) -> None:
    def git(*args: str | bytes) -> None:
        subprocess.run([GIT, "-C", str(tmp_path), *args], check=True, capture_output=True)  # type: ignore[list-item]

    git("init", "-q")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty", "-m", "x")
    git("checkout", "-q", "-b", b"caf\xe9")  # a ref name may hold any byte but a few: not UTF-8 here
    state = metadata.git_state(str(tmp_path))
    assert len(str(state["commit"])) == 40 and state["dirty"] is False
    assert os_text(str(state["branch"])) == "caf\\xe9"  # as the run record stores it
