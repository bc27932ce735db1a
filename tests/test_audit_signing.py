"""The signed audit trail: a history forged without the key never verifies, on SQLite and
PostgreSQL. Each attack is done the way someone with write access to the database but no key
would do it: raw SQL, or gpuledger's own code with no key or a key of their own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from audit_support import audit_key, audit_rows, forge_row, forged_reseal, keyring, no_audit_key, payload_of, sql
from gpuledger.core.audit.chain import canonical_json, check_chain, row_hash
from gpuledger.core.audit.signing import SigningKey, parse_public
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, accounts, audit, audit_sign
from server_support import NOW, batch, bearer, run_doc, setup_accounts


@dataclass
class Signed:
    url: str
    key: SigningKey
    sealed_run: str
    agent: str


def _push_runs(url: str, agent: str) -> str:
    with TestClient(create_app(url)) as client:
        done = run_doc(status="succeeded", ended_at=NOW - 60, exit_code=0)
        assert (
            client.post("/api/v1/ingest", json=batch(done, n=20, final=True), headers=bearer(agent)).status_code == 200
        )
        running = run_doc()
        assert client.post("/api/v1/ingest", json=batch(running, n=5), headers=bearer(agent)).status_code == 200
    return str(done["id"])


@pytest.fixture
def signed(ledger_url: str) -> Iterator[Signed]:
    with audit_key() as key:
        tokens = setup_accounts(ledger_url)
        run_id = _push_runs(ledger_url, tokens.agent_a)
        yield Signed(ledger_url, key, run_id, tokens.agent_a)


def _verify(url: str, *keys: SigningKey, **options: object) -> audit.Verification:
    with Ledger(url) as led:
        return audit.verify(led, keyring=keyring(*keys) if keys else None, **options)  # type: ignore[arg-type]


def test_a_signed_trail_verifies_under_its_public_key(signed: Signed) -> None:
    result = _verify(signed.url, signed.key)
    assert result.ok, result.problems
    assert result.assurance == "signed" and result.signed_through == result.head_seq == result.rows
    assert result.keys == [signed.key.key_id]
    assert all(r["key_id"] == signed.key.key_id for r in audit_rows(signed.url))
    assert _verify(signed.url, signed.key, all_signatures=True).ok
    other = _verify(signed.url, SigningKey.generate())  # the wrong public key: nothing verifies
    assert not other.ok and "written without the key" in other.problems[0]


def test_a_forged_reseal_without_the_key_fails_verify(signed: Signed) -> None:
    url, run_id = signed.url, signed.sealed_run
    sql(url, "UPDATE gpu_intervals SET busy_s = busy_s * 10000 WHERE run_id = :run", run=run_id)
    # gpuledger's own code refuses to extend a signed trail without the key
    with no_audit_key(), Ledger(url) as led, pytest.raises(audit_sign.AuditKeyError, match="signed"):
        led.write(lambda c: audit.seal_run(c, run_id, actor="mallory", reason="late push"))
    seq = forged_reseal(url, run_id)  # so the attacker writes the reseal with SQL
    result = _verify(url, signed.key)
    assert f"audit_log seq {seq}: written without the key" in result.problems[0], result.problems
    assert any(run_id in p and "busy_s" in p for p in result.problems)  # the forged seal is not trusted
    head = f"{seq}:{audit_rows(url)[-1]['hash']}"
    assert not _verify(url, signed.key, expect_head=head).ok


def test_a_key_of_the_attackers_own_is_not_trusted(signed: Signed, tmp_path: Path) -> None:
    url, run_id = signed.url, signed.sealed_run
    sql(url, "UPDATE runs SET status = 'failed' WHERE id = :run", run=run_id)
    mallory = SigningKey.generate()
    # with a key of its own, which does not trust the ledger's head
    with audit_key(mallory), Ledger(url) as led, pytest.raises(audit_sign.AuditKeyError, match="does not trust"):
        led.write(lambda c: audit.seal_run(c, run_id, actor="mallory"))
    keyfile = tmp_path / "trusted.pub"
    keyfile.write_text(signed.key.public.text + "\n")  # public, so the attacker can trust it too
    with audit_key(mallory, trusted=str(keyfile)), Ledger(url) as led:
        led.write(lambda c: audit.seal_run(c, run_id, actor="mallory", reason="late push"))
    assert audit_rows(url)[-1]["key_id"] == mallory.key_id
    result = _verify(url, signed.key)
    assert "written without the key (signed by a key not trusted here" in result.problems[0], result.problems


def test_rows_forged_under_a_later_signed_push_stay_reported(signed: Signed) -> None:
    """The attacker appends a forged reseal, then the server signs the next push on top of it: the
    server finds the unsigned row first and names it in a signed entry, so it is never laundered."""
    url, run_id = signed.url, signed.sealed_run
    sql(url, "DELETE FROM gpu_intervals WHERE run_id = :run AND seq = 3", run=run_id)
    forged = forged_reseal(url, run_id)
    _push_runs(url, signed.agent)  # a legitimate push, signed, after the forged row
    rows = audit_rows(url)
    marker = next(r for r in rows if r["action"] == audit_sign.UNSIGNED_ROWS)
    assert marker["seq"] == forged + 1 and payload_of(marker) == {"first": forged, "last": forged,
                                                                  "found_by": signed.key.key_id}  # fmt: skip
    result = _verify(url, signed.key)
    assert result.signed_through == rows[-1]["seq"]  # the head is good ...
    assert any(f"audit_log seq {forged}: written without the key (found by a writer" in p for p in result.problems)
    assert any(run_id in p and "rows seq 3 deleted" in p for p in result.problems)  # ... the forgery still shows


def test_a_self_consistent_forged_row_mid_chain_breaks_its_link(signed: Signed) -> None:
    url = signed.url
    rows = audit_rows(url)
    target = rows[len(rows) // 2]
    forged = {**target, "actor": "someone else"}
    sql(url, "UPDATE audit_log SET actor = :a, hash = :h WHERE seq = :s",
        a=forged["actor"], h=row_hash(forged, target["prev_hash"]), s=target["seq"])  # fmt: skip
    result = _verify(url, signed.key)
    assert result.signed_through == rows[-1]["seq"]  # the head's signature still holds: only the link shows it
    assert result.problems == [
        f"audit_log seq {target['seq'] + 1}: prev_hash does not match the row before it "
        "(a row before it was deleted, inserted or rewritten)"
    ]


def test_the_chain_check_follows_every_link() -> None:
    rows = []
    prev = "0" * 64
    for seq in range(1, 6):
        row = {"seq": seq, "t": 1.0, "actor": "a", "action": "x", "object": "o", "payload": canonical_json({"n": seq})}
        row["prev_hash"], row["hash"] = prev, row_hash(row, prev)
        rows.append(row)
        prev = row["hash"]
    assert list(check_chain(rows)) == []
    rows[2] = {**rows[2], "payload": canonical_json({"n": 99})}
    rows[2]["hash"] = row_hash(rows[2], rows[2]["prev_hash"])  # consistent with itself
    assert [(p.seq, p.kind) for p in check_chain(rows)] == [(4, "relinked")]


def test_a_leaked_retired_key_cannot_sign_new_history(signed: Signed, tmp_path: Path) -> None:
    url, old = signed.url, signed.key
    new = SigningKey.generate()
    trusted = tmp_path / "old.pub"
    trusted.write_text(old.public.text + "\n")
    with audit_key(new, trusted=str(trusted)), Ledger(url) as led:  # step 3 of a rotation
        retired_after = audit_rows(url)[-1]["seq"]
        accounts.add_project(led, "after-rotation", actor="admin")
    ring = [parse_public(f"{old.public.text} retired-after={retired_after}"), new.public]
    with Ledger(url) as led:
        from gpuledger.core.audit.signing import Keyring

        assert audit.verify(led, keyring=Keyring.of(ring), all_signatures=True).ok
        # the old private key leaks; the thief signs a new project into the trail
        with audit_key(old), pytest.raises(audit_sign.AuditKeyError):
            accounts.add_project(led, "stolen", actor="thief")  # gpuledger itself refuses ...
        forge_row(url, action="project.added", obj="project:stolen", payload={})
        rows = audit_rows(url)
        sql(url, "UPDATE audit_log SET key_id = :k, sig = :s WHERE seq = :q",
            k=old.key_id, s=old.sign(rows[-1]["seq"], rows[-1]["hash"]), q=rows[-1]["seq"])  # fmt: skip
        result = audit.verify(led, keyring=Keyring.of(ring))
    assert not result.ok and "written without the key" in result.problems[0], result.problems


def test_a_trail_written_without_a_key_starts_signing_once(ledger_url: str) -> None:
    with no_audit_key():
        tokens = setup_accounts(ledger_url)
        _push_runs(ledger_url, tokens.agent_a)
        unsigned = _verify(ledger_url)
    assert unsigned.ok and unsigned.assurance == "unsigned"
    with audit_key() as key, Ledger(ledger_url) as led:
        with pytest.raises(audit_sign.AuditKeyError, match="audit key start"):
            accounts.add_project(led, "C", actor="admin")
        first_signed = audit.start_signing(led, actor="admin")
        accounts.add_project(led, "C", actor="admin")
        result = audit.verify(led, keyring=keyring(key))
    assert result.ok, result.problems
    assert result.notes == [f"audit_log seq 1-{first_signed - 1}: written before signing began (hash chain only)"]
    with no_audit_key(), Ledger(ledger_url) as led, pytest.raises(audit_sign.AuditKeyError, match="signed"):
        accounts.add_project(led, "D", actor="admin")  # once signed, a writer without the key is refused


def gl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_AUDIT") and k != "GPULEDGER_DB"}
    return subprocess.run([sys.executable, "-m", "gpuledger", *args], capture_output=True, text=True, timeout=120,
                          env=full | (env or {}))  # fmt: skip


def test_cli_key_new_and_verify_with_the_public_key(tmp_path: Path, ledger_url: str) -> None:
    made = gl("audit", "key", "new", "--out", str(tmp_path / "audit.key"))
    assert made.returncode == 0, made.stderr
    public = made.stdout.strip()
    assert public.startswith("ed25519:") and (tmp_path / "audit.key").stat().st_mode & 0o777 == 0o600
    assert gl("audit", "key", "new", "--out", str(tmp_path / "audit.key")).returncode == 1  # never overwritten
    nowhere = gl("audit", "key", "new", "--out", str(tmp_path / "no" / "audit.key"))  # a usage error, said first
    assert nowhere.returncode == 2 and f"the folder {tmp_path / 'no'} does not exist" in nowhere.stderr, nowhere.stderr
    assert gl("audit", "key", "public", "--key-file", str(tmp_path / "audit.key")).stdout.strip() == public
    env = {"GPULEDGER_AUDIT_KEY_FILE": str(tmp_path / "audit.key")}
    Ledger(ledger_url).close()
    issued = gl("admin", "token", "issue", "--db", ledger_url, env=env)
    assert issued.returncode == 0, issued.stderr
    refused = gl("admin", "project", "add", "vision", "--db", ledger_url)  # no key: one clear line, no traceback
    assert refused.returncode == 1 and "GPULEDGER_AUDIT_KEY_FILE" in refused.stderr
    assert "Traceback" not in refused.stderr
    ok = gl("audit", "verify", "--db", ledger_url, "--public-key", public)
    assert ok.returncode == 0 and ok.stdout.startswith("OK") and "assurance: signed" in ok.stdout, ok.stdout
    (tmp_path / "ring.pub").write_text(f"# the ledger's key\n{public}\n")
    assert gl("audit", "verify", "--db", ledger_url, "--public-key", str(tmp_path / "ring.pub")).returncode == 0
    forge_row(ledger_url, action="token.revoked", obj="token:x", payload={})
    bad = gl("audit", "verify", "--db", ledger_url, "--public-key", public)
    assert bad.returncode == 1 and "TAMPERED  audit_log seq" in bad.stdout and "written without the key" in bad.stdout
    unchecked = gl("audit", "verify", "--db", ledger_url)
    assert "assurance: signed, but the signatures were not checked" in unchecked.stdout
    garbage = gl("audit", "verify", "--db", ledger_url, "--public-key", "ed25519:not-base64!")
    assert garbage.returncode == 1 and "--public-key" in garbage.stderr and "Traceback" not in garbage.stderr
