"""Issue 33, "a trail that cannot be shortened unnoticed": each case against a real ``gpuledger
serve`` (a child process) on SQLite and PostgreSQL.

Cutting rows from the end of the audit trail (a ``token.revoked`` among them) and clearing
``revoked_at``, or restoring an older backup, leaves a chain whose last row is still properly
signed. The server's signed checkpoint, kept outside the database, catches it: ``audit verify``
names it, the server refuses to start on it, and a running server stops serving. And the server
refuses to run on a signed ledger without its key, with a key file others can read, or unsigned
unless told so."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from audit_support import audit_key, audit_rows, no_audit_key, sql
from gpuledger.core.audit.signing import SigningKey
from gpuledger.store import Ledger, accounts, audit, audit_sign
from server_support import ServerProcess, Tokens, batch, bearer, run_doc, setup_accounts

pytestmark = pytest.mark.slow


@dataclass
class Team:
    url: str
    tmp: Path
    key: SigningKey
    key_file: Path
    checkpoint: Path
    tokens: Tokens
    agent_id: str  # a token of project A's agent that the attack revokes and brings back
    agent: str

    def server(self, every_s: float = 0.2) -> ServerProcess:
        """A server signing with the key file (never the key text of this process's environment)."""
        env = {"GPULEDGER_AUDIT_KEY": "", "GPULEDGER_AUDIT_KEY_FILE": str(self.key_file),
               "GPULEDGER_AUDIT_CHECKPOINT": str(self.checkpoint),
               "GPULEDGER_CHECKPOINT_EVERY_S": str(every_s)}  # fmt: skip
        return ServerProcess(self.url, log=self.tmp / "server.log", env=env)

    def head_seq(self) -> int:
        with Ledger(self.url) as led:
            found = led.read(audit_sign.head)
        return 0 if found is None else found.seq


@pytest.fixture
def team(ledger_url: str, tmp_path: Path) -> Iterator[Team]:
    with audit_key() as key:
        key_file = tmp_path / "audit.key"
        key_file.write_text(key.text + "\n")
        key_file.chmod(0o600)
        tokens = setup_accounts(ledger_url)
        with Ledger(ledger_url) as led:
            agent_id, agent = accounts.issue_token(led, "agent-x", role="agent", projects=["A"], actor="test",
                                                   create_user=True)  # fmt: skip
        yield Team(ledger_url, tmp_path, key, key_file, tmp_path / "checkpoint.json", tokens, agent_id, agent)


def _gl(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_AUDIT")} | (env or {})
    return subprocess.run([sys.executable, "-m", "gpuledger", *args], capture_output=True, text=True, timeout=timeout,
                          env=full)  # fmt: skip


def _serve_refused(team: Team, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpuledger serve`` that must refuse to start (it would listen, and time out, otherwise)."""
    base = {"GPULEDGER_AUDIT_KEY_FILE": str(team.key_file), "GPULEDGER_AUDIT_CHECKPOINT": str(team.checkpoint)}
    got = _gl("serve", "--db", team.url, "--port", "0", *extra, env=base | (env or {}), timeout=180)
    assert got.returncode == 1, got.stderr
    return got


def _verify(team: Team) -> subprocess.CompletedProcess[str]:
    return _gl("audit", "verify", "--db", team.url, "--public-key", team.key.public.text, "--checkpoint",
               str(team.checkpoint))  # fmt: skip


def _checkpoint_seq(team: Team) -> int:
    return json.loads(team.checkpoint.read_text())["seq"] if team.checkpoint.exists() else 0


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _push(server: ServerProcess, token: str) -> httpx.Response:
    return httpx.post(server.url + "/api/v1/ingest", json=batch(run_doc(), n=5), headers=bearer(token), timeout=60)


def _runs(server: ServerProcess, team: Team) -> httpx.Response:
    return httpx.get(server.url + "/api/v1/runs", headers=bearer(team.tokens.admin), timeout=60)


def _revoke(team: Team) -> int:
    """Revoke the agent's token (an admin, with the key); the seq of its ``token.revoked`` row."""
    with Ledger(team.url) as led:
        accounts.revoke_token(led, team.agent_id, actor="admin")
    (row,) = [r for r in audit_rows(team.url) if r["action"] == "token.revoked"]
    return int(row["seq"])


def _cut_revocation(team: Team, revoked_seq: int) -> None:
    """What an operator with database access and no key does: the revocation's rows are gone and
    the token is valid again. The chain left ends on a properly signed row."""
    sql(team.url, "DELETE FROM audit_log WHERE seq >= :s", "UPDATE api_tokens SET revoked_at = NULL WHERE id = :t",
        s=revoked_seq, t=team.agent_id)  # fmt: skip
    with Ledger(team.url) as led:  # without the checkpoint, the trail itself has nothing to say
        assert audit.verify(led, keyring=audit_sign.Keyring.of([team.key.public])).ok


def test_a_revocation_cut_from_the_trail_is_named_refused_and_stops_a_running_server(team: Team) -> None:
    with team.server() as server:
        assert _push(server, team.agent).status_code == 200
        revoked = _revoke(team)
        assert _push(server, team.agent).status_code == 401
        _until(lambda: _checkpoint_seq(team) >= revoked, "the checkpoint to reach the revocation")
        _cut_revocation(team, revoked)

        def stopped() -> bool:  # the next tick of the checkpoint keeper finds the chain shortened
            return _runs(server, team).status_code == 503

        _until(stopped, "the server to stop serving")
        refused = _push(server, team.agent)
        assert refused.status_code == 503 and f"ends at seq {revoked - 1}" in refused.json()["detail"]
    assert _checkpoint_seq(team) >= revoked  # the shutdown did not lower it

    again = _serve_refused(team)
    assert f"the audit trail ends at seq {revoked - 1}" in again.stderr
    assert f"reached seq {_checkpoint_seq(team)}" in again.stderr and "gpuledger audit verify" in again.stderr

    found = _verify(team)
    assert found.returncode == 1
    assert f"TAMPERED  audit_log: the audit trail ends at seq {revoked - 1}" in found.stdout, found.stdout


def test_an_append_checks_the_chain_before_the_keeper_does(team: Team) -> None:
    with team.server() as server:
        revoked = _revoke(team)
        _until(lambda: _checkpoint_seq(team) >= revoked, "the checkpoint to reach the revocation")
    with team.server(every_s=3600) as server:  # no tick after the start: only the append's own check
        _cut_revocation(team, revoked)
        refused = _push(server, team.agent)
        assert refused.status_code == 503, refused.text
        assert "checkpoint" in refused.json()["detail"] and f"ends at seq {revoked - 1}" in refused.json()["detail"]
        assert _runs(server, team).status_code == 503
    assert team.head_seq() == revoked - 1  # nothing was appended to the shortened chain
    env = {"GPULEDGER_AUDIT_KEY_FILE": str(team.key_file), "GPULEDGER_AUDIT_CHECKPOINT": str(team.checkpoint)}
    admin = _gl("admin", "token", "revoke", team.agent_id, "--db", team.url, env=env)  # another writer, same host
    assert admin.returncode == 1 and f"the audit trail ends at seq {revoked - 1}" in admin.stderr, admin.stderr
    assert team.head_seq() == revoked - 1


def _backup(team: Team) -> Callable[[], None]:
    """A backup of the ledger now, and how to restore it (SQLite: the file; PostgreSQL: the audit
    trail, whose rows are what the checkpoint speaks of)."""
    if team.url.startswith("sqlite"):
        path = Path(team.url.removeprefix("sqlite:///"))
        shutil.copy(path, team.tmp / "backup.db")
        return lambda: shutil.copy(team.tmp / "backup.db", path)
    seq = team.head_seq()
    return lambda: sql(team.url, "DELETE FROM audit_log WHERE seq > :s", s=seq)


def test_a_restored_backup_is_named_and_refused_also_once_written_on(team: Team) -> None:
    restore = _backup(team)
    backed_up = team.head_seq()
    with team.server() as server:
        for _ in range(3):
            assert _push(server, team.tokens.agent_a).status_code == 200
        _revoke(team)
        latest = team.head_seq()
        _until(lambda: _checkpoint_seq(team) >= latest, "the checkpoint to reach the head")
    restore()
    assert team.head_seq() == backed_up

    found = _verify(team)
    assert found.returncode == 1 and f"TAMPERED  audit_log: the audit trail ends at seq {backed_up}" in found.stdout
    assert f"ends at seq {backed_up}" in _serve_refused(team).stderr

    with audit_key(team.key), Ledger(team.url) as led:  # a key holder without the checkpoint writes on
        while led.read(audit_sign.head).seq <= latest:  # type: ignore[union-attr]
            audit.record_change(led, actor="admin", action="note", obj="ledger", payload={"note": "after a restore"})
    found = _verify(team)
    assert found.returncode == 1, found.stdout
    assert f"TAMPERED  audit_log: the audit trail's row seq {_checkpoint_seq(team)} has hash" in found.stdout
    assert "the chain was replaced" in found.stdout
    assert "the chain was replaced" in _serve_refused(team).stderr


def test_the_checkpoint_is_written_at_shutdown_and_a_changed_one_is_refused(team: Team) -> None:
    with team.server(every_s=3600) as server:
        assert _push(server, team.tokens.agent_a).status_code == 200
    assert _checkpoint_seq(team) == team.head_seq() > 0  # the push's rows, though no tick came after them
    found = _verify(team)
    assert found.returncode == 0 and f"NOTE  checkpoint {team.checkpoint}: the chain still holds" in found.stdout

    doc = json.loads(team.checkpoint.read_text())
    team.checkpoint.write_text(json.dumps(doc | {"seq": doc["seq"] - 1}))  # lowered by hand, to hide a cut
    assert "not signed by a key this server trusts" in _serve_refused(team).stderr
    found = _verify(team)
    assert found.returncode == 1 and "not signed by a trusted key" in found.stdout


def test_serve_refuses_a_signed_ledger_without_its_key(team: Team) -> None:
    for extra in ((), ("--unsigned",)):
        got = _serve_refused(team, *extra, env={"GPULEDGER_AUDIT_KEY_FILE": ""})
        assert f"audit trail is signed (key {team.key.key_id})" in got.stderr
        assert "GPULEDGER_AUDIT_KEY_FILE" in got.stderr


def test_serve_refuses_a_key_file_others_can_read(team: Team) -> None:
    team.key_file.chmod(0o644)
    got = _serve_refused(team)
    assert "can be read by others (mode 0644)" in got.stderr and f"chmod 600 {team.key_file}" in got.stderr
    team.key_file.chmod(0o640)
    assert "mode 0640" in _serve_refused(team).stderr
    team.key_file.chmod(0o600)
    with team.server() as server:
        assert _push(server, team.tokens.agent_a).status_code == 200


def test_running_unsigned_is_a_choice_not_a_fallback(ledger_url: str, tmp_path: Path) -> None:
    with no_audit_key():
        tokens = setup_accounts(ledger_url)  # a fresh ledger: its trail unsigned
    env = {"GPULEDGER_AUDIT_CHECKPOINT": str(tmp_path / "cp.json")}
    got = _gl("serve", "--db", ledger_url, "--port", "0", env=env, timeout=180)
    assert got.returncode == 1 and "no audit key" in got.stderr and "--unsigned" in got.stderr, got.stderr
    key_file = tmp_path / "audit.key"
    key_file.write_text(SigningKey.generate().text + "\n")
    key_file.chmod(0o600)
    both = _gl("serve", "--db", ledger_url, "--port", "0", "--unsigned", env=env | {"GPULEDGER_AUDIT_KEY_FILE":
               str(key_file)}, timeout=180)  # fmt: skip
    assert both.returncode == 1 and "--unsigned, but an audit key is set" in both.stderr
    with ServerProcess(ledger_url, log=tmp_path / "server.log", env=env) as server:  # it passes --unsigned
        assert _push(server, tokens.agent_a).status_code == 200
    assert "--unsigned: the audit trail is a hash chain only" in (tmp_path / "server.log").read_text()
    assert not (tmp_path / "cp.json").exists()  # nothing to sign a checkpoint with
