"""The attacks of issue 14, each against a real ``gpuledger serve`` (a child process) on PostgreSQL
and on SQLite, with the audit trail signed: an agent token rewriting a finished run, intervals
dated outside a run, another host's GPU, a forged reseal under a later push, recording around the
server. Each is refused or named, and the signed trail still verifies."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit_support import audit_key, audit_rows, forged_reseal, keyring, payload_of, sql
from gpuledger.core.audit.signing import SigningKey
from gpuledger.store import Ledger, accounts, audit
from server_support import (
    BACKENDS,
    NOW,
    ServerProcess,
    Tokens,
    backend_url,
    batch,
    bearer,
    gpu_rows,
    run_doc,
    setup_accounts,
)

pytestmark = pytest.mark.slow


@dataclass
class Served:
    url: str
    server: ServerProcess
    tokens: Tokens
    agent_a2: str  # a second agent of project A (another machine)
    key: SigningKey
    key_file: Path

    def post(self, token: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.server.url + "/api/v1/ingest", json=body, headers=bearer(token), timeout=60)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.server.url + "/api/v1" + path, headers=bearer(self.tokens.admin), timeout=60)

    def verify(self) -> audit.Verification:
        with Ledger(self.url) as led:
            return audit.verify(led, keyring=keyring(self.key))


@pytest.fixture(scope="module", params=BACKENDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("attacks")
    with backend_url(request.param, tmp) as url, audit_key() as key:
        key_file = tmp / "audit.key"
        key_file.write_text(key.text + "\n")
        tokens = setup_accounts(url)
        with Ledger(url) as led:
            a2 = accounts.issue_token(led, "agent-a2", role="agent", projects=["A"], actor="test", create_user=True)
        # Every refusal its own push.refused row: these tests count them per run (folding: test_server_bounded.py).
        env = {"GPULEDGER_REFUSED_AUDIT_WINDOW_S": "0"}
        with ServerProcess(url, log=tmp / "server.log", env=env) as server:
            yield Served(url, server, tokens, a2[1], key, key_file)


def _finished(s: Served, n: int = 20) -> dict[str, Any]:
    run = run_doc(status="succeeded", ended_at=NOW - 600, exit_code=0)
    got = s.post(s.tokens.agent_a, batch(run, n=n, final=True))
    assert got.status_code == 200 and got.json()["sealed"], got.text
    log = httpx.put(f"{s.server.url}/api/v1/runs/{run['id']}/log", content=b"epoch 1 done\n",
                    headers=bearer(s.tokens.agent_a), timeout=60)  # fmt: skip
    assert log.status_code == 200, log.text
    return run


def _snapshot(s: Served, run_id: str) -> tuple[Any, ...]:
    shown = s.get(f"/runs/{run_id}").json()
    shown.pop("wall_seconds", None)
    return shown, s.get(f"/runs/{run_id}/intervals").json(), s.get(f"/runs/{run_id}/log").text


def _refusals(s: Served, run_id: str) -> list[dict[str, Any]]:
    return [r for r in audit_rows(s.url) if r["action"] == "push.refused" and r["object"] == f"run:{run_id}"]


REWRITES = {
    "user": lambda r: r | {"user": "mallory"},
    "host": lambda r: r | {"host": "gpu-node-9"},
    "command": lambda r: r | {"command": ["python", "other.py"]},
    "start": lambda r: r | {"started_at": r["started_at"] - 86400},
    "status": lambda r: r | {"status": "failed", "exit_code": 1},
    "team": lambda r: r | {"labels": {**r["labels"], "team": "someone-else"}},
    "end": lambda r: r | {"ended_at": r["ended_at"] + 3600},
}


def test_another_agent_of_the_project_cannot_push_a_run(served: Served) -> None:
    run = _finished(served)
    before = _snapshot(served, run["id"])
    late = {"run": run, "gpu_intervals": gpu_rows(2, first_seq=20)}
    got = served.post(served.agent_a2, late)
    assert got.status_code == 409 and "belongs to 'agent-a'" in got.json()["detail"], got.text
    assert _snapshot(served, run["id"]) == before
    (refused,) = _refusals(served, run["id"])
    assert refused["actor"].startswith("agent-a2 (token ") and "belongs to 'agent-a'" in payload_of(refused)["reason"]
    assert served.verify().ok


@pytest.mark.parametrize("field", sorted(REWRITES))
def test_a_finished_runs_record_cannot_be_rewritten(served: Served, field: str) -> None:
    run = _finished(served)
    before = _snapshot(served, run["id"])
    got = served.post(served.tokens.agent_a, batch(REWRITES[field](run), n=20, final=True))
    assert got.status_code == 409, got.text
    assert _snapshot(served, run["id"]) == before
    assert len(_refusals(served, run["id"])) == 1
    result = served.verify()
    assert result.ok, result.problems


def test_a_finished_runs_gpus_and_log_cannot_change(served: Served) -> None:
    run = _finished(served)
    before = _snapshot(served, run["id"])
    h100 = batch(run, n=20, final=True)
    h100["devices"][0]["name"] = "NVIDIA H100 80GB HBM3"  # A100 became H100
    got = served.post(served.tokens.agent_a, h100)
    assert got.status_code == 409 and "cannot change after it was reported (name)" in got.text
    log = httpx.put(f"{served.server.url}/api/v1/runs/{run['id']}/log", content=b"a different story\n",
                    headers=bearer(served.tokens.agent_a), timeout=60)  # fmt: skip
    assert log.status_code == 409 and "log cannot change" in log.text
    assert _snapshot(served, run["id"]) == before
    assert served.verify().ok


def test_intervals_outside_a_runs_span_are_quarantined(served: Served) -> None:
    run = _finished(served)
    before = _snapshot(served, run["id"])
    years_ago = gpu_rows(3, start=run["started_at"] - 3 * 365 * 86400, first_seq=100)
    after_end = gpu_rows(2, start=run["ended_at"] + 60, first_seq=200)
    got = served.post(served.tokens.agent_a, {"run": run, "gpu_intervals": years_ago + after_end})
    assert got.status_code == 200, got.text
    answer = got.json()
    assert answer["gpu_intervals"] == 0
    reasons = [q["reason"] for q in answer["quarantined"]]
    assert len(reasons) == 5 and sum("before the run started" in r for r in reasons) == 3
    assert sum("after the run ended" in r for r in reasons) == 2
    assert _snapshot(served, run["id"]) == before
    late = served.post(served.tokens.agent_a, {"run": run, "gpu_intervals": gpu_rows(2, first_seq=20)})
    assert late.json()["gpu_intervals"] == 2 and late.json()["sealed"]  # its own missing seqs, inside: taken
    assert served.verify().ok


def test_a_gpu_belongs_to_the_host_that_reported_it(served: Served) -> None:
    _finished(served)  # GPU-0 of gpu-node-1, reported by agent-a
    theirs = run_doc(project="B", started_at=NOW - 3000)
    for host in ("gpu-node-1", "gpu-node-B"):  # A's host name, or its own, with A's GPU UUID
        body = batch(theirs | {"host": host}, n=5)
        body["devices"][0]["uuid"] = "GPU-0"
        for row in body["gpu_intervals"]:
            row["device_uuid"] = "GPU-0"
        got = served.post(served.tokens.agent_b, body)
        assert got.status_code == 409 and "GPU GPU-0 belongs to host 'gpu-node-1'" in got.text, got.text
    assert served.get(f"/runs/{theirs['id']}").status_code == 404
    assert len(_refusals(served, theirs["id"])) == 2
    assert served.post(served.tokens.agent_b, batch(theirs, n=5)).status_code == 200  # its own GPU: fine
    assert served.verify().ok


def _gl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_AUDIT")} | env
    return subprocess.run([sys.executable, "-m", "gpuledger", *args], capture_output=True, text=True, timeout=120,
                          env=full)  # fmt: skip


def test_an_admin_transfer_hands_a_run_to_another_agent(served: Served) -> None:
    run = _finished(served)
    env = {"GPULEDGER_AUDIT_KEY_FILE": str(served.key_file)}
    moved = _gl("admin", "run", "transfer", run["id"], "--to", "agent-a2", "--note", "node re-imaged", "--db",
                served.url, env=env)  # fmt: skip
    assert moved.returncode == 0 and "now belongs to 'agent-a2' (was 'agent-a')" in moved.stdout, moved.stderr
    late = served.post(served.agent_a2, {"run": run, "gpu_intervals": gpu_rows(2, first_seq=20)})
    assert late.status_code == 200 and late.json()["sealed"]
    assert (
        served.post(served.tokens.agent_a, {"run": run, "gpu_intervals": gpu_rows(1, first_seq=22)}).status_code == 409
    )
    transferred = [r for r in audit_rows(served.url) if r["action"] == "run.transferred"][-1]
    assert {"from": "agent-a", "to": "agent-a2", "note": "node re-imaged"}.items() <= payload_of(transferred).items()
    assert served.verify().ok


def test_recording_straight_into_the_team_database_is_refused(served: Served, tmp_path: Path) -> None:
    with Ledger(served.url) as led:
        before = len(led.list_runs())
    done = _gl("run", "--db", served.url, "--no-gpu", "--", sys.executable, "-c", "print('hi')",
               env={"GPULEDGER_HOME": str(tmp_path)})  # fmt: skip
    assert done.returncode == 1 and "team server's ledger" in done.stderr and "--server URL" in done.stderr
    assert "Traceback" not in done.stderr and "hi" not in done.stdout  # refused before the command ran
    with Ledger(served.url) as led:
        assert len(led.list_runs()) == before


# Last: it leaves a forged row in the module's ledger, named by every verify from then on.
def test_a_forged_reseal_is_named_even_after_the_server_signs_on_top(served: Served) -> None:
    run = _finished(served)
    sql(served.url, "UPDATE gpu_intervals SET busy_s = busy_s * 10000 WHERE run_id = :run", run=run["id"])
    forged = forged_reseal(served.url, run["id"])
    assert served.post(served.tokens.agent_a, batch(run_doc(), n=3)).status_code == 200  # the server signs next
    result = served.verify()
    assert any(f"audit_log seq {forged}: written without the key (found by a writer" in p for p in result.problems)
    assert any(run["id"] in p and "busy_s" in p for p in result.problems), result.problems
    # undo, so the module's other tests verify clean: the forged stretch stays named, though
    sql(served.url, "UPDATE gpu_intervals SET busy_s = busy_s / 10000 WHERE run_id = :run", run=run["id"])
    assert [p for p in served.verify().problems if "found by a writer" not in p] == []
