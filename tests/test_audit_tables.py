"""verify checks the access, ownership and rollup tables against the audit trail: a role raised, a
token un-revoked, a membership or token inserted, a rollup's busy seconds multiplied, an owner
changed with SQL are each named; the same ledger untouched verifies clean (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from audit_support import audit_key, keyring, sql
from gpuledger.core.audit.signing import SigningKey
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, accounts, audit
from server_support import NOW, batch, bearer, run_doc, setup_accounts


@dataclass
class World:
    url: str
    key: SigningKey
    finished: str
    running: str
    revoked: str


@pytest.fixture
def world(ledger_url: str) -> Iterator[World]:
    with audit_key() as key:
        tokens = setup_accounts(ledger_url)
        with TestClient(create_app(ledger_url)) as client:
            done = run_doc(status="succeeded", ended_at=NOW - 60, exit_code=0)
            live = run_doc(host="gpu-node-2")  # its own GPU: the finished run is not held back by it
            for doc, final in ((done, True), (live, False)):
                got = client.post("/api/v1/ingest", json=batch(doc, n=12, final=final), headers=bearer(tokens.agent_a))
                assert got.status_code == 200, got.text
        with Ledger(ledger_url) as led:
            revoked = accounts.issue_token(led, "alice", role="member", actor="admin")[0]
            accounts.revoke_token(led, revoked, actor="admin")
            accounts.remove_member(led, "carol", "B", actor="admin")
            accounts.add_member(led, "carol", "B", actor="admin")
            assert materialise_rollups(led)["runs"] >= 1
            result = audit.verify(led, keyring=keyring(key))
            assert result.ok, result.problems
        yield World(ledger_url, key, str(done["id"]), str(live["id"]), revoked)


TOKEN_COLUMNS = "id, user_name, role, projects, secret_sha256, note, created_at, expires_at, revoked_at"
TAMPERING = [
    ("UPDATE api_tokens SET role = 'admin' WHERE user_name = 'agent-a'",
     "role is 'admin', the audit trail says 'agent'", "role raised"),
    ("UPDATE api_tokens SET revoked_at = NULL WHERE id = :revoked",
     "but not revoked now (un-revoked outside gpuledger)", "token un-revoked"),
    ("INSERT INTO memberships (user_name, project) VALUES ('bob', 'A')",
     "memberships: 'bob' in 'A' is not in the audit trail", "membership inserted"),
    ("DELETE FROM memberships WHERE user_name = 'carol' AND project = 'B'",
     "memberships: 'carol' in 'B' (added at audit seq", "membership deleted"),
    ("UPDATE api_tokens SET projects = '[\"A\", \"B\"]' WHERE user_name = 'agent-a'",
     "projects are ['A', 'B'], the audit trail says ['A']", "token widened"),
    # A different first digit whatever it was ('f' over an 'f' would change nothing, 1 run in 16).
    ("UPDATE api_tokens SET secret_sha256 = CASE WHEN substr(secret_sha256, 1, 1) = 'f' THEN 'e' ELSE 'f' END "
     "|| substr(secret_sha256, 2) WHERE user_name = 'root'",
     "its secret was replaced outside gpuledger", "secret replaced"),
    (f"INSERT INTO api_tokens ({TOKEN_COLUMNS}) VALUES ('0123456789ab', 'bob', 'admin', NULL, 'x', NULL, 0, NULL, "
     "NULL)",
     "api_tokens 0123456789ab: not in the audit trail (inserted outside gpuledger)", "token inserted"),
    ("INSERT INTO users (name, created_at, disabled) VALUES ('mallory', 0, false)",
     "users 'mallory': not in the audit trail", "user inserted"),
    ("UPDATE users SET disabled = true WHERE name = 'alice'", "users 'alice': disabled outside gpuledger",
     "user disabled"),
    ("UPDATE gpu_rollups SET busy_s = busy_s * 10000 WHERE run_id = :finished",
     "gpu_rollups edited (they differ from what was written at audit seq", "rollup multiplied"),
    ("UPDATE gpu_rollups SET measured = NOT measured WHERE run_id = :finished",
     "gpu_rollups edited (they differ from what was written at audit seq", "rollup measured flag flipped"),
    ("UPDATE runs SET rolled_up = true WHERE id = :running",
     "rolled up, but the audit trail holds no rollups for it", "flagged rolled up without rollups"),
    ("UPDATE runs SET rolled_up = false WHERE id = :finished",
     "gpu_rollups present but runs.rolled_up is false", "rollups unflagged"),
    ("UPDATE run_owners SET user_name = 'agent-b' WHERE run_id = :finished",
     "owner is 'agent-b', the audit trail says 'agent-a'", "run owner changed"),
    ("UPDATE gpu_owners SET host = 'elsewhere'", "belongs to 'elsewhere' (agent-a), the audit trail says 'gpu-node-1'",
     "GPU re-homed"),
]  # fmt: skip


@pytest.mark.parametrize(("statement", "named", "kind"), TAMPERING, ids=[t[2] for t in TAMPERING])
def test_tampering_with_the_tables_is_named(world: World, statement: str, named: str, kind: str) -> None:
    params = {"revoked": world.revoked, "finished": world.finished, "running": world.running}
    sql(world.url, statement, **{k: v for k, v in params.items() if f":{k}" in statement})
    with Ledger(world.url) as led:
        result = audit.verify(led, keyring=keyring(world.key))
    assert any(named in p for p in result.problems), result.problems
    assert result.signed_through == result.head_seq  # the trail itself is intact: the table was edited
