"""The agent never loses or blocks a run between the local ledger, the spool and the team server.

Real ``gpuledger run --server`` processes against a real ``gpuledger serve`` on PostgreSQL, with
the local SQLite ledger locked at chosen moments (by this test, as another writer would), and a
short busy timeout (``fast_gl.py`` below) so a lock costs a second, not minutes. What is checked is
what a user sees: the server's run equals the local one, the run is in the outbox, no traceback.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gpuledger.agent.client import Client
from gpuledger.agent.pusher import Pusher
from gpuledger.agent.sync import sync
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, RunNotFound, audit, pushes, quarantine
from server_support import NOW, ServerProcess, fresh_pg_url, setup_accounts

pytestmark = pytest.mark.slow

# gpuledger with a 0.5 s SQLite busy timeout and one retry; with TEST_FINAL_FLUSH_FAILED set, it
# touches that file when a flush fails after the recorder stopped (the run's very last flush).
FAST_GL = """
import os, sys
from gpuledger.store import engine

_init = engine.Database.__init__


def _fast(self, url, *, busy_timeout_s=30.0, retries=4):
    _init(self, url, busy_timeout_s=min(busy_timeout_s, 0.5), retries=min(retries, 1))


engine.Database.__init__ = _fast

from gpuledger.store import run_writer  # a local run's own sqlite3 writer: the same short wait

_open = run_writer.RunWriter.open.__func__


def _fast_open(cls, url, *, busy_timeout_s=30.0, retries=4):
    return _open(cls, url, busy_timeout_s=min(busy_timeout_s, 0.5), retries=min(retries, 1))


run_writer.RunWriter.open = classmethod(_fast_open)
signal_file = os.environ.get("TEST_FINAL_FLUSH_FAILED")
if signal_file:
    from gpuledger.recorder.recorder import Recorder

    _stop, _flush = Recorder.stop, Recorder.flush

    def stop(self):
        _stop(self)
        self.test_stopped = True

    def flush(self, force=False):
        ok = _flush(self, force)
        if not ok and getattr(self, "test_stopped", False):
            open(signal_file, "a").close()
        return ok

    Recorder.stop, Recorder.flush = stop, flush
from gpuledger.cli.main import main

sys.argv[0] = "gpuledger"
main()
"""

# A training that reports a metric and an event every 0.2 s until the file GO exists, then says
# its last words (still in the recorder's memory when the run ends) and exits.
TRAIN = """
import os, sys, time
from gpuledger.recorder.control import ControlClient

c = ControlClient.from_env()
go, n, deadline = sys.argv[1], 0, time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    c.send("event", kind="note", message=f"step {n}")
    c.send("metrics", metrics={"loss": 1.0 / (n + 1)}, step=n)
    n += 1
    time.sleep(0.2)
c.send("event", kind="note", message="last words")
print("done", flush=True)
"""

LAST_WORDS = "last words"


class Agent:
    """One machine: a GPULEDGER_HOME with its local ledger, and the CLI run from it."""

    def __init__(self, tmp: Path, server: str, token: str) -> None:
        self.tmp = tmp
        self.server = server
        self.home = tmp / "home"
        self.home.mkdir()
        self.db = self.home / "ledger.db"
        self.local = f"sqlite:///{self.db}"
        Ledger(self.local).close()  # the ledger exists, as after any earlier run
        (tmp / "fast_gl.py").write_text(FAST_GL)
        (tmp / "train.py").write_text(TRAIN)
        self.go = tmp / "go"
        self.env = dict(os.environ, GPULEDGER_HOME=str(self.home), GPULEDGER_TOKEN=token, PYTHONUNBUFFERED="1")
        for var in ("GPULEDGER_DB", "GPULEDGER_SERVER", "CUDA_VISIBLE_DEVICES"):
            self.env.pop(var, None)

    def cli(self, *args: str | bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuledger", *args], env=env or self.env, capture_output=True, text=True,
            errors="replace", timeout=120,
        )  # fmt: skip

    def start_run(self, **env: str) -> subprocess.Popen[str]:
        """``gpuledger run --server`` of TRAIN, which goes on until ``self.go`` exists."""
        return subprocess.Popen(
            [sys.executable, str(self.tmp / "fast_gl.py"), "run", "--server", self.server, "--project", "A",
             "--interval", "0.5", "--replay-gpus", "a100x2-example", "-q", "--",
             sys.executable, str(self.tmp / "train.py"), str(self.go)],
            env=self.env | env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def sync(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.cli("sync", "--server", self.server, *args, env=env)

    def run_id(self) -> str:
        with Ledger(self.local) as led:
            return led.list_runs()[0].id


@contextlib.contextmanager
def locked(db: Path) -> Iterator[None]:
    """The SQLite ledger held by another writer (an exclusive transaction) until the block ends."""
    con = sqlite3.connect(db, isolation_level=None, timeout=30)
    con.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


def wait_for(what: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(RunNotFound, IndexError):
            if found := what():
                return found
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def view(url: str, run_id: str) -> dict[str, Any]:
    """What a user compares between the local ledger and the server: the run's end and every row."""
    with Ledger(url) as led:
        run = led.get_run(run_id)
        return {
            "run": (run.status, run.ended_at, run.exit_code, run.command, run.labels.get("project")),
            "gpu": sorted((i.device_uuid, i.seq, i.t0, i.busy_s) for i in led.gpu_intervals(run_id)),
            "host": sorted((i.seq, i.t0, i.cpu_s) for i in led.host_intervals(run_id)),
            "events": sorted((e.t, e.kind, e.message) for e in led.events(run_id)),
            "metrics": sorted((m.t, m.key, m.value) for m in led.metrics(run_id)),
        }


def messages(v: dict[str, Any]) -> list[str]:
    return [message for _, _, message in v["events"]]


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[Agent, str]]:
    """A real ``gpuledger serve`` on a fresh PostgreSQL schema, and an agent machine pushing to it."""
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with ServerProcess(url, log=tmp_path / "server.log") as server:
            yield Agent(tmp_path, server.url, tokens.agent_a), url


def test_a_spooled_run_is_not_settled_lost_by_sync_and_recover_sends_its_real_end(team) -> None:  # type: ignore[no-untyped-def]
    agent, remote = team
    proc = agent.start_run()
    run_id = wait_for(agent.run_id)
    wait_for(lambda: len(view(remote, run_id)["gpu"]) >= 2)  # the pusher has pushed part of it
    with locked(agent.db):  # from now to the end of the run: its end goes to the spool
        agent.go.touch()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "gpuledger recover" in err, err
    assert (agent.home / "spool" / f"{run_id}.json").exists()

    # `gpuledger sync` first, as the warning suggests: the run is not settled as lost.
    first = agent.sync()
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"{run_id}: waits in the spool" in first.stdout and "1 waiting in the spool" in first.stdout
    assert view(remote, run_id)["run"][0] == "running"
    status = agent.sync("--status")
    assert f"{run_id}  pending" in status.stdout and "waits in the spool" in status.stdout
    # nor by `gpuledger runs`, which settles the runs whose recorder died
    assert agent.cli("runs").returncode == 0
    assert view(agent.local, run_id)["run"][0] == "running"

    # A sync that does not see this spool folder (another GPULEDGER_HOME on the same ledger, an
    # older gpuledger) does settle it lost, and the server seals it so.
    elsewhere = agent.env | {"GPULEDGER_HOME": str(agent.tmp / "elsewhere"), "GPULEDGER_DB": agent.local}
    assert agent.sync(env=elsewhere).returncode == 0
    assert view(remote, run_id)["run"][0] == "lost"
    assert f"{run_id}  done" in agent.sync("--status").stdout

    # recover writes the real end and puts the run back in the outbox; sync pushes it.
    recovered = agent.cli("recover")
    assert recovered.returncode == 0, recovered.stderr
    assert f"recovered run {run_id}" in recovered.stdout and f"in the outbox for {agent.server}" in recovered.stdout
    assert f"{run_id}  pending" in agent.sync("--status").stdout
    second = agent.sync()
    assert second.returncode == 0 and "1 run complete, 0 still in the outbox" in second.stdout, second.stdout
    local = view(agent.local, run_id)
    assert local["run"][0] == "succeeded" and LAST_WORDS in messages(local)
    assert view(remote, run_id) == local
    assert f"{run_id}  done" in agent.sync("--status").stdout
    with Ledger(remote) as led:
        assert audit.verify(led).ok


def test_rows_the_last_flush_could_not_write_are_spooled_not_dropped(team) -> None:  # type: ignore[no-untyped-def]
    agent, remote = team
    final_flush_failed = agent.tmp / "final-flush-failed"
    proc = agent.start_run(TEST_FINAL_FLUSH_FAILED=str(final_flush_failed))
    run_id = wait_for(agent.run_id)
    wait_for(lambda: len(view(agent.local, run_id)["gpu"]) >= 2)
    with locked(agent.db):  # through the run's last two flushes ...
        agent.go.touch()
        wait_for(final_flush_failed.exists)
    # ... and free again for what comes after them (the log, the end of the run)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert "could not be written" in err and "gpuledger recover" in err, err
    assert (agent.home / "spool" / f"{run_id}.json").exists()
    with Ledger(agent.local) as led:
        assert led.get_run(run_id).status != "succeeded"  # never ended without its last rows

    assert agent.cli("recover").returncode == 0
    pushed = agent.sync()
    assert pushed.returncode == 0 and "0 still in the outbox" in pushed.stdout, pushed.stdout
    local = view(agent.local, run_id)
    assert local["run"][0] == "succeeded" and LAST_WORDS in messages(local)
    seqs = [seq for device, seq, _, _ in local["gpu"] if device == local["gpu"][0][0]]
    assert seqs == list(range(len(seqs)))  # every interval, up to the final one
    assert view(remote, run_id) == local


def test_a_run_spooled_before_the_outbox_knew_it_is_pushed_after_recover(team) -> None:  # type: ignore[no-untyped-def]
    agent, remote = team
    with locked(agent.db):  # the whole run: neither the run nor its outbox row is ever written
        proc = agent.start_run()
        time.sleep(2.0)
        agent.go.touch()
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "gpuledger recover" in err, err
    (spooled,) = (agent.home / "spool").glob("*.json")
    run_id = spooled.stem
    status = agent.sync("--status")
    assert f"{run_id}  spooled" in status.stdout, status.stdout

    recovered = agent.cli("recover")
    assert f"in the outbox for {agent.server}" in recovered.stdout, recovered.stdout + recovered.stderr
    assert f"{run_id}  pending" in agent.sync("--status").stdout
    pushed = agent.sync()
    assert pushed.returncode == 0 and "1 run complete, 0 still in the outbox" in pushed.stdout, pushed.stdout
    local = view(agent.local, run_id)
    assert local["run"][0] == "succeeded" and LAST_WORDS in messages(local) and local["gpu"]
    assert view(remote, run_id) == local


def test_a_command_line_that_is_not_utf8_is_pushed_and_blocks_nothing(team) -> None:  # type: ignore[no-untyped-def]
    agent, remote = team
    # A latin-1 file name, as Linux allows: Python hands it over as a surrogate escape.
    ran = subprocess.run(
        [sys.executable, "-m", "gpuledger", "run", "--server", agent.server, "--project", "A", "--no-gpu",
         "--interval", "0.5", "-q", "--", sys.executable.encode(), b"-c", b"pass", b"--data=/data/caf\xe9"],
        env=agent.env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0 and b"cannot push" not in ran.stderr, ran.stderr
    run_id = agent.run_id()
    local = view(agent.local, run_id)
    assert local["run"][3][-1] == "--data=/data/caf\\xe9"  # the byte shown, as valid UTF-8
    assert view(remote, run_id) == local
    assert f"{run_id}  done" in agent.sync("--status").stdout

    # A run an older gpuledger recorded with the raw surrogate, and a good run after it.
    with Ledger(agent.local) as led:
        bad, good = str(uuid.uuid4()), str(uuid.uuid4())
        for run_id_, arg in ((bad, "caf\udce9"), (good, "cafe")):
            led.create_run(
                RunRecord(
                    run_id_, ["python", arg], "u", "h", "/", NOW - 600, labels={"project": "A"}, recorder_pid=None
                )
            )
            led.update_run(run_id_, status="succeeded", ended_at=NOW - 500, exit_code=0)
        pushes.register(led, agent.server, [bad, good])
    lines: list[str] = []
    pusher = Pusher(agent.local, agent.server, None, bad, warn=lines.append, client=Client(agent.server, None))
    pusher.push_once()
    assert "UnicodeEncodeError" in lines[0] and "sync --status" in lines[0] and "server is back" not in lines[0]
    # Not taken for a server that is down: the error is kept on the run's outbox row.
    assert f"{bad}  failed  failed: UnicodeEncodeError" in agent.sync("--status").stdout

    synced = agent.sync()
    assert synced.returncode == 1 and "Traceback" not in synced.stderr, synced.stderr
    assert f"{bad}: could not be pushed" in synced.stdout and "1 failed (see --status)" in synced.stdout
    assert view(remote, good)["run"][0] == "succeeded"  # the loop went on
    status = agent.sync("--status").stdout
    assert f"{bad}  failed  failed: UnicodeEncodeError" in status and f"{good}  done" in status


def test_events_too_large_for_one_batch_go_in_several(team) -> None:  # type: ignore[no-untyped-def]
    agent, remote = team
    code = (
        "import time\nfrom gpuledger.recorder.control import ControlClient\nc = ControlClient.from_env()\n"
        "for i in range(150):\n    c.send('event', kind='note', message=f'{i} ' + 'x' * 60000)\n    time.sleep(0.01)\n"
        "time.sleep(1)\n"
    )  # 150 events of 60,000 characters, each under the 65,536 limit: ~9 MB, over the 8 MiB body limit
    ran = agent.cli("run", "--server", agent.server, "--project", "A", "--no-gpu", "--interval", "0.5", "-q", "--",
                    sys.executable, "-c", code)  # fmt: skip
    assert ran.returncode == 0 and "refused" not in ran.stderr, ran.stderr
    run_id = agent.run_id()
    assert f"{run_id}  done" in agent.sync("--status").stdout
    local = view(agent.local, run_id)
    assert len(local["events"]) == 150 and local["run"][0] == "succeeded"
    assert view(remote, run_id) == local


class Recording(httpx.BaseTransport):
    """The app's transport, noting the status and body size of every answer to an ingest."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.ingests: list[tuple[int, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/ingest"):
            self.ingests.append((response.status_code, len(request.content)))
        return response


def _big_events_run(led: Ledger, n: int, size: int) -> str:
    run_id = str(uuid.uuid4())
    start = NOW - 3600
    led.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", start, labels={"project": "A"}))
    led.append(run_id, [], [], [Event(start + 10 + i, "note", f"{i} " + "x" * size) for i in range(n)], [])
    led.update_run(run_id, status="succeeded", ended_at=start + 3001, exit_code=0)
    return run_id


def test_batches_are_cut_by_their_bytes_so_the_server_never_answers_413(tmp_path: Path) -> None:
    with fresh_pg_url() as remote:
        token = setup_accounts(remote).agent_a
        with TestClient(create_app(remote)) as app_client:  # the default 8 MiB body limit
            local = Ledger(tmp_path / "local.db")
            run_id = _big_events_run(local, 150, 60000)  # ~9 MB of events, each under every row limit
            recording = Recording(app_client._transport)
            report = sync(local, Client("http://testserver", token, transport=recording), all_runs=True)
    assert report.done == [run_id] and not report.rejected
    assert [status for status, _ in recording.ingests] == [200] * len(recording.ingests)
    assert len(recording.ingests) >= 3 and max(size for _, size in recording.ingests) <= 4 * 1024 * 1024


@pytest.fixture
def small_server() -> Iterator[tuple[TestClient, str, str]]:
    """The real server app, with a body limit of 256 KiB (as a proxy in front of it might have)."""
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with TestClient(create_app(url, settings=Settings(max_body_b=256 * 1024))) as app_client:
            yield app_client, url, tokens.agent_a


def test_a_413_splits_the_batch_and_only_a_row_too_large_alone_is_kept_aside(tmp_path: Path, small_server) -> None:  # type: ignore[no-untyped-def]
    app_client, remote, token = small_server
    local = Ledger(tmp_path / "local.db")
    run_id = str(uuid.uuid4())
    start = NOW - 3600
    local.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", start, labels={"project": "A"}))
    local.add_devices(run_id, [GpuIdentity(0, "GPU-0", "NVIDIA A100-SXM4-80GB")])
    gpu = [GpuInterval("GPU-0", i, start + 5 * i, start + 5 * i + 5, 5, busy_s=2.0) for i in range(600)]
    host = [HostInterval(i, start + 5 * i, start + 5 * i + 5, 5, cpu_s=1.0) for i in range(600)]
    events = [Event(start + 10 + i, "note", f"{i} " + "x" * 30000) for i in range(40)]  # 1.2 MB
    events.insert(20, Event(start + 29.5, "note", "huge", {"blob": "y" * 400_000}))  # over 256 KiB alone
    local.append(run_id, gpu, host, events, [])
    local.update_run(run_id, status="succeeded", ended_at=start + 3001, exit_code=0)
    client = Client("http://testserver", token, transport=app_client._transport)

    report = sync(local, client, all_runs=True)
    assert report.done == [run_id] and not report.rejected, report
    assert report.quarantined == {run_id: 1} and report.batches > 5
    (aside,) = quarantine.for_server(local, "http://testserver")[run_id]
    assert aside["series"] == "events" and aside["item"] == "seq 20" and "too large" in aside["reason"]
    here, there = view(local.url, run_id), view(remote, run_id)
    assert here["run"] == there["run"] and here["run"][0] == "succeeded"
    assert there["gpu"] == here["gpu"] and there["host"] == here["host"] and there["metrics"] == here["metrics"]
    assert messages(there) == [m for m in messages(here) if m != "huge"] and len(messages(there)) == 40
    with Ledger(remote) as led:
        assert audit.verify(led).ok


def test_a_sync_refused_for_its_token_says_to_fix_the_token_and_loses_nothing(team) -> None:  # type: ignore[no-untyped-def]
    """A 401 is not a server that is away: "run gpuledger sync again later" would send the same
    token again. The outbox keeps the run, and a sync with the right token pushes it."""
    from test_agent_outbox import _local_run

    agent, remote = team
    with Ledger(agent.local) as led:
        run_id = _local_run(led, 3)
    bad = agent.env | {"GPULEDGER_TOKEN": "glt_000000000000_" + "x" * 43}
    refused = agent.sync("--all", env=bad)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "HTTP 401" in refused.stderr and "fix the token, then run gpuledger sync" in refused.stderr
    assert "again later" not in refused.stderr
    pushed = agent.sync()
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    assert f"{run_id}  done" in agent.sync("--status").stdout
    assert len(view(remote, run_id)["gpu"]) == 3
