"""``gpuledger audit seal`` is an admin's approval that says what it approves: it lists and changes
nothing by itself, seals only what it is told, never adopts a hand-written run in bulk, and needs
the audit key on a signed ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from audit_support import audit_key, audit_rows, keyring, payload_of
from gpuledger.core.ids import short_id
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, audit
from server_support import NOW, batch, bearer, run_doc, setup_accounts


def gl(*args: str, key_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_AUDIT") and k != "GPULEDGER_DB"}
    if key_file is not None:
        env["GPULEDGER_AUDIT_KEY_FILE"] = str(key_file)
    return subprocess.run([sys.executable, "-m", "gpuledger", *args], capture_output=True, text=True, timeout=120,
                          env=env)  # fmt: skip


def test_audit_seal_approves_exactly_what_it_lists(ledger_url: str, tmp_path: Path) -> None:
    with Ledger(ledger_url) as led:  # before the ledger was a team ledger: a run and its rollups, unaudited
        t0 = NOW - 7200
        led.create_run(RunRecord("legacy", ["train"], "ana", "old-node", "/", t0, status="succeeded", ended_at=t0 + 600,
                                 labels={"project": "A"}))  # fmt: skip
        led.add_devices("legacy", [GpuIdentity(0, "GPU-old", "NVIDIA A100-SXM4-80GB")])
        led.append(
            "legacy", [GpuInterval("GPU-old", i, t0 + 60 * i, t0 + 60 * (i + 1), 6, busy_s=30.0) for i in range(10)]
        )
        materialise_rollups(led)
    with audit_key() as key:
        key_file = tmp_path / "audit.key"
        key_file.write_text(key.text)
        tokens = setup_accounts(ledger_url)
        never_final = run_doc(status="succeeded", ended_at=NOW - 60, exit_code=0)  # its last batch never came
        with TestClient(create_app(ledger_url)) as client:
            got = client.post("/api/v1/ingest", json=batch(never_final, n=5), headers=bearer(tokens.agent_a))
            assert got.status_code == 200 and not got.json()["sealed"]
        with Ledger(ledger_url) as led:
            problems = audit.verify(led, keyring=keyring(key)).problems
        assert any(f"run {never_final['id']}: succeeded but never sealed" in p for p in problems)
        assert any("run legacy: inserted outside gpuledger" in p for p in problems)
        assert any("run legacy: rolled up, but the audit trail holds no rollups" in p for p in problems)
        before = len(audit_rows(ledger_url))

        listed = gl("audit", "seal", "--db", ledger_url, key_file=key_file)
        assert listed.returncode == 0, listed.stderr
        assert f"UNSEALED  {never_final['id']}  succeeded" in listed.stdout and "5 GPU intervals" in listed.stdout
        assert "FOREIGN   legacy" in listed.stdout and "ROLLUPS   legacy" in listed.stdout
        assert "Nothing was changed" in listed.stdout and len(audit_rows(ledger_url)) == before

        no_key = gl("audit", "seal", "--db", ledger_url, "--yes")
        assert no_key.returncode == 1 and "GPULEDGER_AUDIT_KEY_FILE" in no_key.stderr
        assert len(audit_rows(ledger_url)) == before

        approved = gl("audit", "seal", "--db", ledger_url, "--yes", key_file=key_file)
        assert approved.returncode == 0, approved.stderr
        assert (
            f"sealed run {never_final['id']}" in approved.stdout and "recorded the rollups of 1 runs" in approved.stdout
        )
        assert "adopted" not in approved.stdout  # a run written outside gpuledger is never approved in bulk
        seal = next(
            r for r in audit_rows(ledger_url) if r["action"] == "run.sealed" and never_final["id"] in r["object"]
        )
        assert seal["actor"].startswith("cli:") and payload_of(seal)["reason"] == "approved by an admin: never sealed"
        with Ledger(ledger_url) as led:
            assert audit.verify(led, keyring=keyring(key)).problems == [
                "run legacy: inserted outside gpuledger (no run.created entry in the audit log)"
            ]
        adopted = gl("audit", "seal", "--db", ledger_url, "--adopt", "legacy", key_file=key_file)
        assert adopted.returncode == 0 and "adopted run legacy" in adopted.stdout, adopted.stderr
        assert gl("audit", "seal", "--db", ledger_url, "--run", "nope", key_file=key_file).returncode == 1
        with Ledger(ledger_url) as led:
            result = audit.verify(led, keyring=keyring(key))
        assert result.ok, result.problems


@pytest.mark.parametrize("args", [("--run", "x"), ("--adopt", "x")])
def test_audit_seal_refuses_what_it_cannot_approve(ledger_url: str, tmp_path: Path, args: tuple[str, str]) -> None:
    with audit_key() as key:
        setup_accounts(ledger_url)
        key_file = tmp_path / "audit.key"
        key_file.write_text(key.text)
    done = gl("audit", "seal", "--db", ledger_url, *args, key_file=key_file)
    assert done.returncode == 1 and "nothing to" in done.stderr and "Traceback" not in done.stderr


def test_retention_never_seals_what_nobody_approved(ledger_url: str) -> None:
    """A run written around the server, and a finished run never sealed, are left as they are by the
    daily retention (reported), not sealed "before retention" into looking legitimate."""
    from gpuledger.store.retention import DAY_S, Policy, run_retention

    with audit_key() as key:
        tokens = setup_accounts(ledger_url)
        never_final = run_doc(status="succeeded", ended_at=NOW - 60, started_at=NOW - 3600, exit_code=0)
        with TestClient(create_app(ledger_url)) as client:
            got = client.post("/api/v1/ingest", json=batch(never_final, n=5), headers=bearer(tokens.agent_a))
            assert got.status_code == 200
        from audit_support import sql

        columns = 'id, status, command, cwd, "user", host, started_at, ended_at, labels, git, versions, replayed, ' + (
            "interval_s, meta"
        )
        sql(ledger_url, f"INSERT INTO runs ({columns}) VALUES ('forged', 'succeeded', '[]', '/', 'x', 'h', "
                        f"{NOW - 3600}, {NOW - 60}, '{{}}', '{{}}', '{{}}', false, 5, '{{}}')")  # fmt: skip
        with Ledger(ledger_url) as led:
            report = run_retention(led, Policy(raw_days=0, log_days=0, run_days=0), actor="cron", now=NOW + DAY_S)
            assert set(report.skipped) == {never_final["id"], "forged"}
            assert all(why.startswith("never sealed") for why in report.skipped.values())
            assert report.runs_deleted == 0 and len(led.list_runs()) == 2
            problems = audit.verify(led, keyring=keyring(key)).problems
        assert any("run forged: inserted outside gpuledger" in p for p in problems)
        assert any(f"run {never_final['id']}: succeeded but never sealed" in p for p in problems)


def test_chargeback_names_the_billed_runs_the_trail_never_sealed(ledger_url: str, tmp_path: Path) -> None:
    """Finance must see which of the runs it bills are not protected by the trail: a finished run
    whose last batch never came is named until an admin seals it; a sealed one is not."""
    from datetime import datetime, timezone

    day = datetime.fromtimestamp(NOW, timezone.utc).date()
    window = ("--from", (day.fromordinal(day.toordinal() - 1)).isoformat(), "--to", day.isoformat())

    def chargeback() -> tuple[dict[str, Any], str]:
        got = gl("report", "chargeback", "--db", ledger_url, *window, "--format", "json")
        assert got.returncode == 0, got.stderr
        text = gl("report", "chargeback", "--db", ledger_url, *window)
        assert text.returncode == 0, text.stderr
        return json.loads(got.stdout), text.stdout

    with audit_key() as key:
        key_file = tmp_path / "audit.key"
        key_file.write_text(key.text)
        tokens = setup_accounts(ledger_url)
        sealed = run_doc(status="succeeded", ended_at=NOW - 60, exit_code=0)
        never_final = run_doc(status="succeeded", ended_at=NOW - 60, exit_code=0)
        with TestClient(create_app(ledger_url)) as client:
            for run, final in ((sealed, True), (never_final, False)):
                got = client.post("/api/v1/ingest", json=batch(run, n=5, final=final), headers=bearer(tokens.agent_a))
                assert got.status_code == 200 and got.json()["sealed"] is final, got.text
        report, text = chargeback()
        assert report["unsealed_runs"] == [never_final["id"]]
        assert any(w.startswith("1 finished run billed here was never sealed") for w in report["warnings"])
        assert short_id(never_final["id"]) in text and "gpuledger audit seal" in text  # the ID gpuledger runs shows

        approved = gl("audit", "seal", "--db", ledger_url, "--yes", key_file=key_file)
        assert approved.returncode == 0, approved.stderr
        report, text = chargeback()
        assert report["unsealed_runs"] == [] and "never sealed" not in text
        assert report["total"]["runs"] == 2  # both still billed


def test_chargeback_of_a_local_ledger_says_no_trail_is_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'local.db'}"
    with Ledger(url) as led:
        led.create_run(RunRecord("r1", ["train"], "ana", "node", "/", NOW - 600, status="succeeded", ended_at=NOW - 60))
        led.add_devices("r1", [GpuIdentity(0, "GPU-1", "NVIDIA A100-SXM4-80GB")])
        led.append("r1", [GpuInterval("GPU-1", 0, NOW - 600, NOW - 60, 6, busy_s=300.0)])
    got = gl("report", "chargeback", "--db", url, "--format", "json", "--from", "2000-01-01")
    assert got.returncode == 0, got.stderr
    report = json.loads(got.stdout)
    assert report["unsealed_runs"] is None and not any("sealed" in w for w in report["warnings"])
