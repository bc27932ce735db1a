"""A reader that stops early (``gpuledger runs | head -1``): every command ends quietly with 0.

Each command runs as a real process whose stdout is a pipe with its read end already closed, so
its first write fails with EPIPE (Python ignores SIGPIPE). Before, ``export`` and ``logs`` ended
with 0 but the commands that print through rich (``runs``, ``query``, ``report``) exited 1, which
fails a script under ``set -o pipefail``; none may print a traceback or an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diag_support import T0
from gpuledger.core.ids import short_id
from gpuledger.store import Ledger
from report_support import write_run

RUN = "0190d0d0-0000-7000-8000-00000000cccc"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("closed") / "ledger.db"
    with Ledger(path) as ledger:
        write_run(ledger, RUN, status="succeeded", starved=False, name="a", started_at=T0 - 86400)
        ledger.set_log(RUN, b"epoch 1/3\n" * 1000)
    return str(path)


@pytest.mark.parametrize(
    "args",
    [["runs"], ["runs", "--json"], ["show", "{a}"], ["query", "gpu-hours"], ["query", "failures"],
     ["report", "chargeback"], ["cost", "{a}"], ["export", "{a}"], ["logs", "{a}"]],
    ids=" ".join,
)  # fmt: skip
def test_a_closed_stdout_ends_quietly_with_0(args: list[str], db: str, tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte
    env = {**os.environ, "GPULEDGER_DB": db, "GPULEDGER_HOME": str(tmp_path), "GPULEDGER_RATES": ""}
    argv = [sys.executable, "-m", "gpuledger", *(a.replace("{a}", short_id(RUN)) for a in args)]
    try:
        done = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, env=env, text=True, timeout=120)
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
