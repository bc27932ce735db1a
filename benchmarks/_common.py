"""Helpers shared by recorder_tick.py and wrapper_overhead.py (not a benchmark itself)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from importlib import metadata

import psutil

# The workload metered in the recorder benchmark: one parent and 7 workers (8 processes),
# each busy ~5 % of a core (5 ms of work, 95 ms asleep); host_tick.py and recorder_tick.py meter it.
WORKER = (
    "import time\n"
    "while True:\n"
    "    t = time.perf_counter()\n"
    "    while time.perf_counter() - t < 0.005: pass\n"
    "    time.sleep(0.095)\n"
)
PARENT = (
    "import subprocess, sys\n"
    f"ws = [subprocess.Popen([sys.executable, '-c', {WORKER!r}]) for _ in range(7)]\n"
    "exec(" + repr(WORKER) + ")\n"
)


def start_tree() -> subprocess.Popen[bytes]:
    """Start the 8-process tree; returns the parent once all 7 workers are up."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    deadline = time.monotonic() + 30
    while len(psutil.Process(parent.pid).children(recursive=True)) < 7:
        if time.monotonic() > deadline:
            raise SystemExit("the benchmark's process tree did not start")
        time.sleep(0.1)
    return parent


def stop_tree(parent: subprocess.Popen[bytes]) -> None:
    try:
        kids = psutil.Process(parent.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    for proc in kids:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    parent.kill()
    parent.wait()


def p95(xs: Sequence[float]) -> float:
    """Nearest-rank 95th percentile."""
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_line() -> str:
    """One line describing where the figures were taken."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}); "
        f"{platform.platform()}; Python {platform.python_version()}; psutil {version('psutil')}; "
        f"load average {load}"
    )


def source_state(repo: str | None = None) -> str:
    """The commit measured (this checkout, or ``repo``), and the files of src/ that differ from it."""
    repo = repo or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        top = subprocess.run(["git", "-C", repo, "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        if os.path.realpath(top) != os.path.realpath(repo):  # a plain copy inside another checkout
            return f"source: {repo} (not a git checkout of its own)"
        head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        changed = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--", "src"], capture_output=True,
                                 text=True, check=True).stdout.split("\n")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "source: not a git checkout"
    names = [line[3:] for line in changed if line[:2].strip() == "M"]
    return f"source: {head}" + (f" + uncommitted changes to {', '.join(names)}" if names else "")


def gpuledger_executable() -> str:
    """The installed ``gpuledger`` console script of this interpreter (not a pyenv or similar shim)."""
    here = os.path.join(sysconfig.get_path("scripts"), "gpuledger")
    return here if os.path.exists(here) else "gpuledger"


def tree_child_json(script: str, tree: str, args: Sequence[str]) -> dict:
    """Run ``script --child ARGS`` with another source tree's code (TREE/src first on the path) and
    return the JSON object its last line prints: the same benchmark, measuring that tree."""
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"))
    cmd = [sys.executable, os.path.abspath(script), "--child", *args]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])
