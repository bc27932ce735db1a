"""A month of normal operation verifies clean, signed, on SQLite and PostgreSQL: agents record
locally and push from their outboxes (running, then finished, late rows, lost runs, a shared GPU),
logs are stored, tokens are rotated and revoked, memberships change, a run is transferred, and the
documented daily retention (cost rollups, 1-minute and 1-hour intervals, old logs deleted) runs
every day. Not one false alarm: ``verify`` reports nothing, and every run is sealed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from audit_support import audit_key, keyring
from gpuledger.agent.client import Client
from gpuledger.agent.sync import sync
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts, audit, ownership
from gpuledger.store.retention import DAY_S, Policy, run_retention
from server_support import NOW, setup_accounts

SERVER = "http://testserver"
DAYS = 30
OPEN_DAYS = 62  # months close this long after they end (store/closed_months.py): none within the replay
STEP = 60.0  # one interval a minute: a two-hour run has 120 per GPU


class Node:
    """One machine: its local ledger and its agent's token."""

    def __init__(self, path: Path, host: str, token: str, project: str) -> None:
        self.ledger = Ledger(path)
        self.host, self.token, self.project = host, token, project

    def record(
        self, start: float, minutes: int, gpus: list[str], *, end: str | None = "succeeded", gap: range = range(0)
    ) -> str:
        run_id = str(uuid.uuid4())
        run = RunRecord(run_id, ["python", "train.py", "--epochs", "3"], "ana", self.host, "/work", start,
                        labels={"project": self.project, "team": "vision"})  # fmt: skip
        self.ledger.create_run(run)
        self.ledger.add_devices(run_id, [GpuIdentity(i, u, "NVIDIA A100-SXM4-80GB") for i, u in enumerate(gpus)])
        self.append(run_id, start, [i for i in range(minutes) if i not in gap], gpus)
        if end is not None:
            self.finish(run_id, start + minutes * STEP, end)
        return run_id

    def append(self, run_id: str, start: float, seqs: list[int], gpus: list[str]) -> None:
        first = seqs[0]
        gpu = [GpuInterval(u, i, start + i * STEP, start + (i + 1) * STEP, 12, busy_s=30.0 + i % 7, energy_j=9000.0,
                           proc_sm_util_avg_pct=40.0 + 10 * g) for g, u in enumerate(gpus) for i in seqs]  # fmt: skip
        host = [HostInterval(i, start + i * STEP, start + (i + 1) * STEP, 12, cpu_s=20.0) for i in seqs]
        events = [Event(start + first * STEP + 1, "epoch_end", "", {"epoch": first})]
        metrics = [Metric(start + first * STEP + 2, "loss", 1.0 / (first + 1), epoch=first)]
        self.ledger.append(run_id, gpu, host, events, metrics)

    def finish(self, run_id: str, end: float, status: str) -> None:
        self.ledger.set_log(run_id, f"training {run_id[:8]}\ndone\n".encode())
        self.ledger.update_run(run_id, status=status, ended_at=end, exit_code=0 if status == "succeeded" else 1)

    def push(self, client: TestClient) -> None:
        with Client(SERVER, self.token, transport=client._transport) as agent:
            report = sync(self.ledger, agent, all_runs=True)
        assert not report.rejected and not report.forbidden, (report.rejected, report.forbidden)


@pytest.mark.slow
def test_a_month_of_normal_operation_verifies_clean(ledger_url: str, tmp_path: Path) -> None:
    with audit_key() as key:
        tokens = setup_accounts(ledger_url)
        team = Ledger(ledger_url)
        node1 = Node(tmp_path / "node-1.db", "node-1", tokens.agent_a, "A")
        node2 = Node(tmp_path / "node-2.db", "node-2", tokens.agent_b, "B")
        runs: list[str] = []
        # The month is replayed in seconds, its days all pushed now: no month may have closed meanwhile.
        with TestClient(create_app(ledger_url, settings=Settings(close_after_days=OPEN_DAYS))) as client:
            for day in range(DAYS):
                t = NOW - (DAYS - day) * DAY_S + 3600
                live = node1.record(t, 90, ["GPU-n1-0"], end=None)  # pushed while it records ...
                node1.push(client)
                node1.append(live, t, list(range(90, 120)), ["GPU-n1-0"])
                node1.finish(live, t + 120 * STEP, "succeeded")  # ... then finished
                theirs = node2.record(t + 600, 60, ["GPU-n2-0", "GPU-n2-1"], end="failed")
                runs += [live, theirs]
                if day % 5 == 0:  # two runs of node-1 share a GPU for half an hour
                    runs += [
                        node1.record(t + 4 * 3600, 60, ["GPU-n1-1"]),
                        node1.record(t + 4.5 * 3600, 60, ["GPU-n1-1"]),
                    ]
                if day == 10:  # a run whose recorder died: lost locally, pushed as lost
                    lost = node1.record(t + 8 * 3600, 20, ["GPU-n1-0"], end=None)
                    node1.ledger.update_run(lost, status="lost", ended_at=t + 8 * 3600 + 20 * STEP)
                    runs.append(lost)
                node1.push(client)
                node2.push(client)
                if day == 12:  # rows that reach the server after the run was sealed: its own missing seqs
                    late = node1.record(t + 6 * 3600, 60, ["GPU-n1-0"], gap=range(30, 40))
                    node1.push(client)
                    node1.append(late, t + 6 * 3600, list(range(30, 40)), ["GPU-n1-0"])
                    # below the outbox's watermarks: they travel when the run is pushed again from scratch
                    # (a local ledger restored from a backup), and the rest of it is stored once
                    node1.ledger.write(lambda c, r=late: c.execute(sa.text("DELETE FROM push_state WHERE run_id = :r"),
                                                                   {"r": r}))  # fmt: skip
                    runs.append(late)
                if day == 14:  # node-1's token is rotated: the old one revoked, the runs stay its own
                    token_id, node1.token = accounts.issue_token(team, "agent-a", role="agent", projects=["A"],
                                                                 actor="admin")  # fmt: skip
                    accounts.revoke_token(team, tokens.agent_a[4:16], actor="admin")
                    assert token_id != tokens.agent_a[4:16]
                if day == 15:
                    accounts.add_project(team, "C", actor="admin")
                    accounts.add_member(team, "alice", "C", actor="admin")
                    accounts.remove_member(team, "carol", "B", actor="admin")
                if day == 20:  # node-2 was re-imaged with a new agent identity
                    accounts.issue_token(team, "agent-b2", role="agent", projects=["B"], actor="admin",
                                         create_user=True)  # fmt: skip
                    ownership.transfer(team, theirs, "agent-b2", actor="admin", note="node-2 re-imaged")
                policy = Policy(raw_days=7, minute_days=20, log_days=25)
                report = run_retention(team, policy, actor="cron", now=t + DAY_S, cost_rollups=materialise_rollups)
                assert not report.skipped, report.skipped
        result = audit.verify(team, keyring=keyring(key), all_signatures=True, close_after_days=OPEN_DAYS)
        assert result.ok, result.problems[:10]
        assert result.notes == [] and result.assurance == "signed" and result.signed_through == result.rows
        assert result.unsealed_running == 0
        rolled = team.read(lambda c: c.execute(sa.text("SELECT count(*) FROM rollup_marks")).scalar())
        assert rolled > 0  # retention really rewrote intervals, and the seals followed
        assert result.runs_checked == len(team.list_runs())  # every run sealed, none left for `audit seal`
        actions = team.read(
            lambda c: [(r[0], r[1]) for r in c.execute(sa.text("SELECT action, payload FROM audit_log"))]
        )
        done = {a for a, _ in actions}  # each kind of normal operation really happened
        assert {
            "run.ended",
            "run.resealed",
            "run.rolled_up",
            "log.deleted",
            "rollups.written",
            "rollups.dropped",
            "token.revoked",
            "member.removed",
            "run.transferred",
            "gpu.registered",
            "retention.run",
        } <= done
        assert any(a == "run.resealed" and "late push: 10 GPU intervals" in p for a, p in actions)
        team.close()
        for node in (node1, node2):
            node.ledger.close()
