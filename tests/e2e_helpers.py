"""Helpers for end-to-end tests that run the real ``gpuledger`` CLI as a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

GPULEDGER = [sys.executable, "-m", "gpuledger"]


def cli_env(home: Path, db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GPULEDGER_HOME=str(home), GPULEDGER_DB=db_url, PYTHONUNBUFFERED="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*GPULEDGER, *args], env=env, capture_output=True, timeout=timeout, **kw)


def show_json(run_ref: str, env: dict[str, str]) -> dict:
    out = run_cli(["show", run_ref, "--json"], env)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def runs_json(env: dict[str, str], *args: str) -> list[dict]:
    out = run_cli(["runs", "--json", *args], env)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def only_run(env: dict[str, str]) -> dict:
    rows = runs_json(env)
    assert len(rows) == 1, rows
    return show_json(rows[0]["id"], env)


def py(code: str) -> list[str]:
    """A command line running ``code`` in a fresh Python."""
    return [sys.executable, "-c", code]
