"""Many writers at once: runs on one machine share one SQLite file; a server takes many clients.

8 processes (spawned, so each has its own SQLite connections, as separate runs would) open the same
fresh database at the same moment (racing to migrate it), then each appends 50 batches.
Nothing may be lost or duplicated.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuledger.core.model import Event, Metric
from gpuledger.store import Ledger, LedgerLocked
from test_store_records import T0, full_device, full_gpu, full_host, minimal_run, run_id

WRITERS = 8
BATCHES = 50
DEVICES = ("GPU-a", "GPU-b")


def _writer(url: str, n: int, barrier: mp.synchronize.Barrier) -> None:  # runs in a child process
    barrier.wait(timeout=60)
    with Ledger(url) as led:
        rid = run_id(n)
        led.create_run(minimal_run(rid))
        led.add_devices(rid, [full_device(i, uuid) for i, uuid in enumerate(DEVICES)])
        for seq in range(BATCHES):
            led.append(
                rid,
                [full_gpu(uuid, seq) for uuid in DEVICES],
                [full_host(seq)],
                [Event(T0 + seq, "tick", f"batch {seq}")],
                [Metric(T0 + seq, "loss", 1.0 / (seq + 1), step=seq)],
            )
        led.update_run(rid, status="succeeded", ended_at=T0 + BATCHES)


def test_concurrent_writers_lose_nothing(ledger_url: str) -> None:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    procs = [ctx.Process(target=_writer, args=(ledger_url, n, barrier)) for n in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    with Ledger(ledger_url) as led:
        runs = led.list_runs()
        assert len(runs) == WRITERS and {r.status for r in runs} == {"succeeded"}
        for n in range(WRITERS):
            rid = run_id(n)
            gpu = led.gpu_intervals(rid)
            assert [(g.device_uuid, g.seq) for g in gpu] == [(d, s) for d in DEVICES for s in range(BATCHES)]
            assert [h.seq for h in led.host_intervals(rid)] == list(range(BATCHES))
            assert [e.message for e in led.events(rid)] == [f"batch {s}" for s in range(BATCHES)]
            assert len(led.metrics(rid)) == BATCHES and len(led.devices(rid)) == len(DEVICES)


def test_locked_sqlite_raises_ledger_locked_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger(path, busy_timeout_s=0.05, retries=2) as led:
        rid = run_id(1)
        led.create_run(minimal_run(rid))
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer holding the lock for too long
        try:
            with pytest.raises(LedgerLocked, match="retry later"):
                led.append(rid, [full_gpu("GPU-a", 0)])
            assert led.gpu_intervals(rid) == []  # readers are not blocked (WAL)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        led.append(rid, [full_gpu("GPU-a", 0)])  # the caller's retry lands
        assert len(led.gpu_intervals(rid)) == 1


def test_a_run_recorded_while_another_process_holds_the_ledger_ends_when_its_command_does(tmp_path: Path) -> None:
    """`gpuledger run` into a SQLite file another process holds locked for 6 s: the 1 s command's
    run is 1 s long (not the lock's 6 s: the wall time and allocated hours are the command's),
    and nothing is lost once the lock is let go."""
    path = tmp_path / "ledger.db"
    Ledger(path).close()  # the schema exists; the holder then takes the write lock
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(6.0, lambda: (holder.execute("ROLLBACK"), holder.close()))
    release.start()
    t0 = time.time()
    cmd = [sys.executable, "-m", "gpuledger", "run", "--db", f"sqlite:///{path}", "--no-gpu", "-q", "--interval", "0.5",
           "--", sys.executable, "-c", "import time; time.sleep(1)"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    release.join()
    assert done.returncode == 0, done.stderr
    assert time.time() - t0 >= 5.5  # it did wait for the lock to write
    assert done.stderr == ""  # -q: not a word about the wait (longer than the 5 s notice)
    with Ledger(path) as led:
        (run,) = led.list_runs()
        host = led.host_intervals(run.id)
    assert run.status == "succeeded"
    assert 1.0 <= run.ended_at - run.started_at < 2.5, (run.started_at, run.ended_at)
    assert host and host[-1].t1 == run.ended_at  # the final reading ends the run
    assert [h.seq for h in host] == list(range(len(host)))


def test_a_run_waiting_on_a_held_ledger_after_its_command_ended_says_why(tmp_path: Path) -> None:
    """The command has ended and the terminal would sit silent while the ledger is held: after 5 s
    one line says gpuledger is still writing the run and what happens if it stays busy. The
    holder lets go once that line is read (no guessed wait); the run is then written whole."""
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    cmd = [sys.executable, "-m", "gpuledger", "run", "--db", f"sqlite:///{path}", "--no-gpu", "--interval", "0.5",
           "--", sys.executable, "-c", "pass"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:  # until the notice; EOF first (no notice, the run spooled) fails below
            lines.append(line)
            if line.startswith("gpuledger: still writing run"):
                break
        holder.execute("ROLLBACK")
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 0, "".join(lines) + rest
    finally:
        holder.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    with Ledger(path) as led:
        (run,) = led.list_runs()
    notice = lines[-1]
    assert notice.startswith(f"gpuledger: still writing run {run.id} to the ledger after 5 s"), lines
    assert "gpuledger recover" in notice
    assert "still writing" not in rest  # said once, though both the last flush and the end waited
    assert run.status == "succeeded" and f"run {run.id}" in rest  # then the summary, as always
