"""The team server with real processes: two ``gpuledger serve`` replicas on one PostgreSQL, and
``gpuledger run --server`` surviving a server that dies mid-run and comes back."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import pytest

from gpuledger.store import Ledger, audit
from server_support import ServerProcess, batch, bearer, fresh_pg_url, gpu_rows, host_rows, run_doc, setup_accounts

T = TypeVar("T")

pytestmark = pytest.mark.slow


def _cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuledger", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, GPULEDGER_HOME=str(home), PYTHONUNBUFFERED="1")
    env.pop("GPULEDGER_DB", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def _rows(url: str, run_id: str) -> dict[str, list[tuple[object, ...]]]:
    with Ledger(url) as led:
        return {
            "gpu": sorted((i.device_uuid, i.seq, i.t0, i.busy_s, i.energy_j) for i in led.gpu_intervals(run_id)),
            "host": sorted((i.seq, i.t0, i.cpu_s) for i in led.host_intervals(run_id)),
            "events": [(e.t, e.kind, e.message) for e in led.events(run_id)],
            "metrics": [(m.t, m.key) for m in led.metrics(run_id)],
        }


def test_two_replicas_share_one_ledger_and_concurrent_pushes_stay_idempotent(tmp_path: Path) -> None:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with ServerProcess(url, log=tmp_path / "r1.log") as r1, ServerProcess(url, log=tmp_path / "r2.log") as r2:
            run = run_doc()
            first = batch(run, n=10, devices=2)  # both GPUs the batches below have rows of
            pushed = httpx.post(r1.url + "/api/v1/ingest", json=first, headers=bearer(tokens.agent_a))
            assert pushed.status_code == 200, pushed.text
            seen = httpx.get(f"{r2.url}/api/v1/runs/{run['id']}", headers=bearer(tokens.member_a))
            assert seen.status_code == 200 and seen.json()["id"] == run["id"]

            # 8 agents push the same 6 batches of one run, to both replicas, at the same time
            ended = run | {"status": "succeeded", "ended_at": run["started_at"] + 3000, "exit_code": 0}
            bodies = [
                {"run": ended, "gpu_intervals": gpu_rows(100, 2, first_seq=k * 100),
                 "host_intervals": host_rows(100, first_seq=k * 100), "final": k == 5}
                for k in range(6)
            ]  # fmt: skip
            errors: list[str] = []

            def agent(i: int) -> None:
                with httpx.Client(timeout=60) as http:
                    for j, body in enumerate(bodies):
                        target = (r1, r2)[(i + j) % 2]
                        got = http.post(target.url + "/api/v1/ingest", json=body, headers=bearer(tokens.agent_a))
                        if got.status_code != 200:
                            errors.append(got.text)

            threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            assert errors == []
            listed = httpx.get(r1.url + "/api/v1/runs", headers=bearer(tokens.admin)).json()
            assert [r["id"] for r in listed] == [run["id"]] and listed[0]["status"] == "succeeded"
        with Ledger(url) as led:
            assert len(led.gpu_intervals(run["id"])) == 1200 and len(led.host_intervals(run["id"])) == 600
            result = audit.verify(led)
            assert result.ok, result.problems
            actions = led.read(
                lambda c: [
                    r[0] for r in c.execute(audit.T.audit_log.select().with_only_columns(audit.T.audit_log.c.action))
                ]
            )
            assert actions.count("run.created") == 1 and actions.count("run.ended") == 1


def _local_url(home: Path) -> str:
    return f"sqlite:///{home}/ledger.db"


def _wait(check: Callable[[], T], what: str, limit_s: float = 60.0) -> T:
    """Poll until ``check`` gives something truthy (a local ledger not written yet counts as not yet)."""
    deadline = time.monotonic() + limit_s
    while True:
        with contextlib.suppress(Exception):
            if found := check():
                return found
        assert time.monotonic() < deadline, f"waited {limit_s:.0f} s for {what}"
        time.sleep(0.1)


def _first_run(url: str) -> str:
    with Ledger(url) as led:
        return led.list_runs()[0].id


def test_server_stopped_mid_run_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        server = ServerProcess(url, log=tmp_path / "server.log").start()
        env = _env(tmp_path / "home", GPULEDGER_TOKEN=tokens.agent_a)
        go = tmp_path / "go"
        # 14 steps of a second at least, and on until the test says so: the run outlives the outage.
        code = (
            "import os, sys, time\ni = 0\nwhile i < 14 or not os.path.exists(sys.argv[1]):\n"
            "    print('step', i, flush=True); i += 1; time.sleep(1)\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", "run", "--server", server.url, "--project", "A", "--interval", "1",
             "--replay-gpus", "a100x2-example", "--", sys.executable, "-c", code, str(go)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            home_url = _local_url(tmp_path / "home")
            _wait((tmp_path / "home" / "ledger.db").exists, "the local ledger")  # not made here first
            run_id = _wait(lambda: _first_run(home_url), "the run to start")
            pushed = _wait(lambda: len(_rows(url, run_id)["gpu"]), "the server to hold some of the run")
            server.stop()  # the server dies while the run records
            _wait(lambda: len(_rows(home_url, run_id)["gpu"]) >= pushed + 4, "intervals recorded while it is away")
            server.start()  # ... and comes back on the same port
            go.touch()
            _, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
        try:
            assert proc.returncode == 0, err
            assert "cannot push" in err  # said once, the training went on
            local = Ledger(_local_url(tmp_path / "home"))
            run_id = local.list_runs()[0].id
            assert "pushing to" in err and "again" in err  # the pusher drained once the server was back
            assert "not fully on" not in err, err
            mine, theirs = _rows(_local_url(tmp_path / "home"), run_id), _rows(url, run_id)
            assert len(mine["gpu"]) > 20 and len(mine["host"]) > 8
            assert theirs == mine  # nothing lost, nothing twice
            with Ledger(url) as remote:
                assert remote.get_run(run_id).status == "succeeded"
                assert b"step 13" in (remote.get_log(run_id) or b"")
                assert audit.verify(remote).ok
        finally:
            server.stop()


def test_runs_recorded_while_the_server_was_away_are_pushed_by_sync(tmp_path: Path) -> None:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        server = ServerProcess(url, log=tmp_path / "server.log")  # not started yet
        env = _env(tmp_path / "home", GPULEDGER_TOKEN=tokens.agent_a)
        offline = _cli(["run", "--server", server.url, "--project", "A", "--no-gpu", "--interval", "0.5", "-q", "--",
                        sys.executable, "-c", "import time; time.sleep(1.5)"], env)  # fmt: skip
        assert offline.returncode == 0 and "gpuledger sync" in offline.stderr
        plain = _cli(["run", "--project", "A", "--no-gpu", "-q", "--", sys.executable, "-c", "pass"], env)
        assert plain.returncode == 0
        with server:
            first = _cli(["sync", "--server", server.url], env)
            assert first.returncode == 0, first.stdout + first.stderr
            assert "1 run complete, 0 still in the outbox" in first.stdout
            every = _cli(["sync", "--server", server.url, "--all"], env)
            assert "1 run complete" in every.stdout, every.stdout
            listed = _cli(
                ["runs", "--server", server.url, "--json"], _env(tmp_path / "home", GPULEDGER_TOKEN=tokens.member_a)
            )
            assert listed.returncode == 0, listed.stderr
            assert len(json.loads(listed.stdout)) == 2
            again = _cli(["sync", "--server", server.url, "--all"], env)
            assert "pushed 0 rows" in again.stdout
