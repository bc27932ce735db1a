"""The audit trail: every kind of tampering done with raw SQL is detected and named."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from gpuledger.core.audit.chain import GENESIS, check_chain, row_hash
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, audit
from server_support import NOW, batch, bearer, fresh_pg_url, gpu_rows, run_doc, setup_accounts


@pytest.fixture
def sealed() -> Iterator[tuple[str, str, str]]:
    """A ledger with two sealed runs and one still running: (url, sealed run id, other run id)."""
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with TestClient(create_app(url)) as client:
            ids = []
            for end in (NOW - 60, NOW - 30, None):
                extra = {"status": "succeeded", "ended_at": end, "exit_code": 0} if end else {}
                doc = run_doc(**extra)
                got = client.post("/api/v1/ingest", json=batch(doc, n=20, devices=2, final=end is not None),
                                  headers=bearer(tokens.agent_a))  # fmt: skip
                assert got.status_code == 200
                ids.append(doc["id"])
            client.put(f"/api/v1/runs/{ids[0]}/log", content=b"the log\n", headers=bearer(tokens.agent_a))
        with Ledger(url) as led:
            assert audit.verify(led).ok, audit.verify(led).problems
        yield url, ids[0], ids[1]


def _sql(url: str, *statements: str, **params: object) -> None:
    with Ledger(url) as led, led.database.engine.begin() as conn:
        for s in statements:
            conn.execute(sa.text(s), params)


def _problems(url: str, expect_head: str | None = None) -> list[str]:
    with Ledger(url) as led:
        return audit.verify(led, expect_head=expect_head).problems


TAMPERING: list[tuple[str, str, str]] = [
    ("UPDATE runs SET status = 'failed' WHERE id = :run", "runs.status edited", "edited run row"),
    ("UPDATE runs SET ended_at = ended_at + 3600 WHERE id = :run", "runs.ended_at edited", "edited run end"),
    ("UPDATE run_labels SET value = 'B' WHERE run_id = :run AND key = 'project'", "run_labels rows", "edited label"),
    ("UPDATE gpu_intervals SET busy_s = busy_s * 2 WHERE run_id = :run AND device_uuid = 'GPU-1' AND seq = 7",
     "gpu_intervals/GPU-1: row seq 7 edited", "edited interval"),
    ("DELETE FROM gpu_intervals WHERE run_id = :run AND device_uuid = 'GPU-0' AND seq = 4",
     "gpu_intervals/GPU-0: rows seq 4 deleted", "deleted interval"),
    ("INSERT INTO host_intervals (run_id, seq, t0, t1, samples, cpu_s, rss_max_b, read_b, write_b, threads_max, "
     "procs_max) VALUES (:run, 99, 1, 2, 1, 1000, 0, 0, 0, 1, 1)", "host_intervals: rows seq 99 inserted",
     "inserted interval"),
    ("UPDATE gpu_intervals SET temp_max_c = 10 WHERE run_id = :run AND device_uuid = 'GPU-0' AND seq = 2",
     "gpu_intervals/GPU-0: row seq 2 edited", "edited gauge (no total changes)"),
    ("UPDATE metrics SET value = 0.01 WHERE run_id = :run", "metrics: rows edited", "edited metric"),
    ("DELETE FROM events WHERE run_id = :run", "events: 1 rows sealed, 0 now", "deleted event"),
    ("UPDATE logs SET data = 'rewritten' WHERE run_id = :run", "logs: the stored log changed", "edited log"),
    ("UPDATE devices SET name = 'Tesla T4' WHERE run_id = :run", "devices rows", "edited device"),
    ("DELETE FROM runs WHERE id = :run", "deleted (sealed at audit seq", "deleted run"),
]  # fmt: skip


@pytest.mark.parametrize(("statement", "named", "kind"), TAMPERING, ids=[t[2] for t in TAMPERING])
def test_tampering_with_runs_and_intervals_is_named(sealed, statement: str, named: str, kind: str) -> None:  # type: ignore[no-untyped-def]
    url, run_id, other = sealed
    _sql(url, statement, run=run_id)
    problems = _problems(url)
    assert any(run_id in p and named in p for p in problems), problems
    assert not any(other in p for p in problems)  # the untouched run stays clean


def test_run_inserted_by_hand_is_named(sealed) -> None:  # type: ignore[no-untyped-def]
    url, _, _ = sealed
    columns = 'id, status, command, cwd, "user", host, started_at, labels, git, versions, replayed, interval_s, meta'
    values = "'forged', 'succeeded', '[]', '/', 'x', 'h', 0, '{}', '{}', '{}', false, 5, '{}'"
    _sql(url, f"INSERT INTO runs ({columns}) VALUES ({values})")
    assert "run forged: inserted outside gpuledger (no run.created entry in the audit log)" in _problems(url)


def _audit_rows(url: str) -> list[dict]:  # type: ignore[type-arg]
    with Ledger(url) as led:
        return led.read(
            lambda c: [dict(r) for r in c.execute(sa.text("SELECT * FROM audit_log ORDER BY seq")).mappings()]
        )


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("UPDATE audit_log SET payload = '{\"user\": \"mallory\"}' WHERE seq = 3", "audit_log seq 3: edited"),
        ("UPDATE audit_log SET actor = 'nobody' WHERE seq = 5", "audit_log seq 5: edited"),
        ("DELETE FROM audit_log WHERE seq = 4", "audit_log seq 4: deleted"),
        ("UPDATE audit_log SET seq = seq + 100 WHERE seq = 6", "audit_log seq 6: deleted"),
        (f"INSERT INTO audit_log VALUES (1000, 0, 'me', 'token.issued', 'token:x', '{{}}', '{GENESIS}', 'abc')",
         "audit_log seq 1000: edited"),
    ],
)  # fmt: skip
def test_tampering_with_the_audit_log_is_named(sealed, statement: str, named: str) -> None:  # type: ignore[no-untyped-def]
    url, _, _ = sealed
    _sql(url, statement)
    problems = _problems(url)
    assert any(named in p for p in problems), problems


def test_a_recomputed_chain_is_caught_by_an_external_head(sealed) -> None:  # type: ignore[no-untyped-def]
    url, _, _ = sealed
    rows = _audit_rows(url)
    head = f"{rows[-1]['seq']}:{rows[-1]['hash']}"
    # an attacker who knows the algorithm deletes the last row and the chain still checks out
    _sql(url, "DELETE FROM audit_log WHERE seq = :s", s=rows[-1]["seq"])
    assert list(check_chain(_audit_rows(url))) == []
    assert any("recorded head" in p for p in _problems(url, expect_head=head))


def test_legitimate_changes_keep_the_trail_valid(sealed) -> None:  # type: ignore[no-untyped-def]
    url, run_id, _ = sealed
    from gpuledger.store import accounts

    with Ledger(url) as led, TestClient(create_app(url)) as client:
        token = accounts.issue_token(led, "agent-a", role="agent", projects=["A"], actor="test")[1]
        run = led.get_run(run_id)
        doc = run_doc(run_id=run_id, status="succeeded", ended_at=run.ended_at, exit_code=0, started_at=run.started_at)
        late = client.post("/api/v1/ingest", json={"run": doc, "gpu_intervals": gpu_rows(3, first_seq=20)},
                           headers=bearer(token))  # fmt: skip
        assert late.json()["sealed"]
        accounts.revoke_token(led, token[4:16], actor="test")
        assert audit.verify(led).ok, audit.verify(led).problems
        rows = _audit_rows(url)
        assert all(r["hash"] == row_hash(r, r["prev_hash"]) for r in rows)


def test_cli_verify_names_the_row_and_fails(sealed) -> None:  # type: ignore[no-untyped-def]
    url, run_id, _ = sealed
    ok = subprocess.run(
        [sys.executable, "-m", "gpuledger", "audit", "verify", "--db", url], capture_output=True, text=True, timeout=60
    )
    assert ok.returncode == 0 and ok.stdout.startswith("OK"), ok.stdout + ok.stderr
    _sql(
        url,
        "UPDATE gpu_intervals SET energy_j = 0 WHERE run_id = :run AND seq = 1 AND device_uuid = 'GPU-0'",
        run=run_id,
    )
    bad = subprocess.run(
        [sys.executable, "-m", "gpuledger", "audit", "verify", "--db", url], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 1
    assert f"TAMPERED  run {run_id}: gpu_intervals/GPU-0: row seq 1 edited" in bad.stdout
    assert "total energy_j" in bad.stdout
