"""Migration 14 gives ``runs.swept_at`` to the runs the liveness sweep marked lost before the column
existed, from the trail (its own ``run.ended`` row), never from the reason's text: a run whose
agent copied the sweep's wording stays its agent's, and a sealed run keeps its seal."""

from __future__ import annotations

import time

import sqlalchemy as sa
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.store import Ledger, audit, liveness_sweep
from server_support import bearer, gpu_rows, run_doc, setup_accounts

HOUR = 3600.0


def _column(url: str, run_id: str) -> float | None:
    with Ledger(url) as led:
        q = sa.text("SELECT swept_at FROM runs WHERE id = :id")
        return led.read(lambda c: c.execute(q, {"id": run_id}).scalar())


def test_migration_14_marks_only_the_sweeps_own_verdicts(ledger_url: str) -> None:
    tokens = setup_accounts(ledger_url)
    start = time.time() - 2 * HOUR
    swept, sealed, forged = (run_doc(started_at=start) for _ in range(3))
    with TestClient(create_app(ledger_url)) as client:
        for run in (swept, sealed, forged):
            body = {"run": run, "gpu_intervals": gpu_rows(3, start=start)}
            assert client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a)).status_code == 200
        reason = f"{liveness_sweep.REASON_PREFIX} 3600 s (no push, no interval)"
        copied = forged | {"status": "lost", "ended_at": start + 15, "status_reason": reason}
        assert client.post("/api/v1/ingest", json={"run": copied}, headers=bearer(tokens.agent_a)).status_code == 200
    with Ledger(ledger_url) as led:
        marked = liveness_sweep.sweep(led.database, lost_after_s=HOUR, now=time.time() + 2 * HOUR)
        assert sorted(marked) == sorted([swept["id"], sealed["id"]])
        led.write(lambda c: audit.seal_run(c, sealed["id"], actor="root"))
        # The ledger as version 13 had it: the verdict only in the text.
        led.write(lambda c: c.execute(sa.text("ALTER TABLE runs DROP COLUMN swept_at")))
        led.write(lambda c: c.execute(sa.text("DELETE FROM schema_version WHERE version >= 14")))
    q = sa.text("SELECT t FROM audit_log WHERE object = :o AND action = 'run.ended'")
    with Ledger(ledger_url) as led:  # migrates
        ended = led.read(lambda c: c.execute(q, {"o": f"run:{swept['id']}"}).scalar())
    assert _column(ledger_url, swept["id"]) == ended  # the sweep's run.ended row
    assert _column(ledger_url, sealed["id"]) is None  # sealed: its seal holds as it was
    assert _column(ledger_url, forged["id"]) is None  # the wording copied by its agent
