"""`gpuledger run` loads only what a run needs: its fixed cost is mostly import time (BENCHMARKS.md).

Into a local SQLite ledger that exists already (every run but the first), the run's rows are written
with the standard sqlite3 module (store/run_writer.py): SQLAlchemy and the schema are never loaded.

A real `gpuledger run -q -- python -c pass` runs in a child interpreter whose `subprocess.Popen`
is watched: the moment it execs the command, the names in `sys.modules` are written to a file,
and again when the recorder process exits. An eager import of a heavy library (the database
layer, the HTTP client, report renderers, data libraries) put back anywhere on the way shows up
in those sets. No timing is measured, so the test holds on a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpuledger.collect import nvml_lib

MARKER = "gpuledger-import-probe"

PROBE = r"""
import atexit, json, os, subprocess, sys

out, marker, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
me = os.getpid()
execute_child = subprocess.Popen._execute_child


def watched(self, args, *rest, **kw):
    if any(marker in str(a) for a in args):  # the command itself, not a helper such as git
        with open(out + ".exec", "w") as fh:
            json.dump(sorted(sys.modules), fh)
    return execute_child(self, args, *rest, **kw)


def at_exit():
    if os.getpid() == me:  # the recorder, not a forked child of it
        with open(out + ".exit", "w") as fh:
            json.dump(sorted(sys.modules), fh)


subprocess.Popen._execute_child = watched
atexit.register(at_exit)
sys.argv = ["gpuledger", *argv]
from gpuledger.cli.main import main

main()
"""

# Never needed by a local `gpuledger run`, neither before the command starts nor after it ends.
NEVER = (
    "httpx",  # the team-server client: only with --server
    "rich",
    "jinja2",
    "pyarrow",
    "pandas",
    "numpy",
    "fastapi",
    "uvicorn",
    "starlette",
    "cryptography",  # audit-trail signing: the team server's
    "gpuledger.server",
    "gpuledger.reports",
    "gpuledger.agent",
    "gpuledger.store.audit",
    "gpuledger.core.pricing",
    "sqlalchemy",  # a local ledger is written with sqlite3 (store/run_writer.py)
    "gpuledger.store.ledger",
    "gpuledger.store.schema",
    "importlib.metadata",  # the versions a run records are read without it (recorder/dist_versions.py)
)
# Not needed by a quick run without GPUs either: busy time's period learning (statistics, with
# fractions) runs only on GPU samples.
NOT_WITHOUT_GPU = ("statistics", "fractions")
# Needed once the command runs (the ledger, the end-of-run reading of the log), never before it
# is started: the command should not wait for them. (The collectors take their first reading
# before the start, so psutil and NVML may be loaded by then.)
NOT_BEFORE_EXEC = (
    "gpuledger.store.run_writer",
    "gpuledger.integrations.ultralytics",
)


def loaded(names: list[str], package: str) -> list[str]:
    return [n for n in names if n == package or n.startswith(package + ".")]


def probe_run(
    tmp_path: Path, *args: str, command: tuple[str, ...] = (), status: int = 0
) -> tuple[list[str], list[str], str]:
    """Modules loaded when the command was exec'd and when the recorder exited, and its stderr.
    ``command``: another command than ``python -c pass`` (its last word holds the marker)."""
    out = tmp_path / "modules"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["GPULEDGER_HOME"] = str(tmp_path / "home")
    argv = ["run", "-q", *args, "--", *(command or (sys.executable, "-c", f"pass  # {MARKER}"))]
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), MARKER, *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == status, proc.stderr
    exec_file, exit_file = Path(f"{out}.exec"), Path(f"{out}.exit")
    assert exec_file.exists(), "the probe never saw the command being started (is it still started by Popen?)"
    return json.loads(exec_file.read_text()), json.loads(exit_file.read_text()), proc.stderr


def existing_ledger(url: str) -> None:
    """The ledger as the first gpuledger command leaves it (created and migrated with SQLAlchemy)."""
    from gpuledger.store import Ledger

    Ledger(url).close()


def run_count(url: str) -> int:
    from gpuledger.store import Ledger

    with Ledger(url, migrate=False) as led:
        return len(led.list_runs())


def test_a_local_run_loads_no_heavy_library_and_starts_the_command_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/home/ledger.db"
    existing_ledger(url)
    at_exec, at_exit, _ = probe_run(tmp_path, "--no-gpu")
    for package in (*NEVER, *NOT_WITHOUT_GPU):
        assert not loaded(at_exit, package), f"{package} was imported by a local gpuledger run"
    for package in NOT_BEFORE_EXEC:
        assert not loaded(at_exec, package), f"{package} was imported before the command was started"
    # and the run was recorded all the same, by the sqlite3 writer loaded once the command ran
    assert loaded(at_exit, "gpuledger.store.run_writer")
    assert run_count(url) == 1


def test_the_gpu_probe_and_an_explicit_ledger_load_nothing_heavy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/explicit.db"
    existing_ledger(url)
    _, at_exit, _ = probe_run(tmp_path, "--db", url)  # NVML tried: whatever this machine has
    for package in NEVER:
        assert not loaded(at_exit, package), f"{package} was imported by gpuledger run --db {url}"
    if not nvml_lib.loadable():  # no driver here: found out without pynvml and the NVML collector
        assert not loaded(at_exit, "pynvml") and not loaded(at_exit, "gpuledger.collect.nvml")
    assert run_count(url) == 1


def test_the_first_run_creates_the_ledger(tmp_path: Path) -> None:
    _, at_exit, _ = probe_run(tmp_path, "--no-gpu")  # no ledger yet: SQLAlchemy creates its schema
    assert loaded(at_exit, "sqlalchemy")
    assert run_count(f"sqlite:///{tmp_path}/home/ledger.db") == 1


def test_a_command_that_cannot_start_is_recorded_without_the_database_layer(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/home/ledger.db"
    existing_ledger(url)
    missing = str(tmp_path / f"no-such-program-{MARKER}")
    _, at_exit, stderr = probe_run(tmp_path, "--no-gpu", command=(missing,), status=127)
    assert "cannot start" in stderr
    for package in NEVER:
        assert not loaded(at_exit, package), f"{package} was imported by a failed launch"
    from gpuledger.store import Ledger

    with Ledger(url, migrate=False) as led:
        (run,) = led.list_runs()
    assert (run.status, run.exit_code) == ("failed", 127)
