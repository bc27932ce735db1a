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


@pytest.mark.skipif(GIT is None, reason="git is not installed")
def test_commit_branch_dirty_and_remote_are_those_git_itself_reports(tmp_path: Path) -> None:
    def git(*args: str) -> str:
        out = subprocess.run([GIT, "-C", str(tmp_path), *args], check=True, capture_output=True, text=True)  # type: ignore[list-item]
        return out.stdout.strip()

    assert metadata.git_state(str(tmp_path)) == {}  # not a repository
    git("init", "-q", "-b", "main")
    assert metadata.git_state(str(tmp_path)) == {}  # no commit yet
    (tmp_path / "train.py").write_text("print(1)\n")
    git("add", "train.py")
    git("-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "-m", "x")
    head = git("rev-parse", "HEAD")
    assert metadata.git_state(str(tmp_path)) == {"commit": head, "branch": "main", "dirty": False}
    (tmp_path / "notes.txt").write_text("untracked\n")  # untracked files do not make it dirty
    assert metadata.git_state(str(tmp_path))["dirty"] is False
    (tmp_path / "train.py").write_text("print(2)\n")
    git("remote", "add", "origin", "https://example.com/team/detector.git")
    assert metadata.git_state(str(tmp_path)) == {
        "commit": head,
        "branch": "main",
        "dirty": True,
        "remote": "https://example.com/team/detector.git",
    }
    git("checkout", "-q", "--detach")  # detached: no branch
    assert "branch" not in metadata.git_state(str(tmp_path))
    bare = tmp_path / "bare.git"
    subprocess.run([GIT, "clone", "-q", "--bare", str(tmp_path), str(bare)], check=True, capture_output=True)  # type: ignore[list-item]
    assert metadata.git_state(str(bare))["commit"] == head  # no work tree: asked in parts
