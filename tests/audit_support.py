"""Helpers for the audit tests: an audit key in the environment, raw SQL, forged chain rows."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from gpuledger.core.audit.chain import canonical_json, row_hash
from gpuledger.core.audit.signing import Keyring, SigningKey
from gpuledger.store import Ledger, audit_sign


@contextlib.contextmanager
def audit_key(key: SigningKey | None = None, trusted: str | None = None) -> Iterator[SigningKey]:
    """This process (and the servers it starts) signs with ``key`` (a new one by default)."""
    key = key or SigningKey.generate()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(audit_sign.ENV_KEY, key.text)
        mp.delenv(audit_sign.ENV_KEY_FILE, raising=False)
        if trusted is None:
            mp.delenv(audit_sign.ENV_TRUSTED, raising=False)
        else:
            mp.setenv(audit_sign.ENV_TRUSTED, trusted)
        yield key


@contextlib.contextmanager
def no_audit_key() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for name in (audit_sign.ENV_KEY, audit_sign.ENV_KEY_FILE, audit_sign.ENV_TRUSTED):
            mp.delenv(name, raising=False)
        yield


def keyring(*keys: SigningKey) -> Keyring:
    return Keyring.of(k.public for k in keys)


def sql(url: str, *statements: str, **params: object) -> None:
    with Ledger(url) as led, led.database.engine.begin() as conn:
        for s in statements:
            conn.execute(sa.text(s), params)


def audit_rows(url: str) -> list[dict[str, Any]]:
    with Ledger(url) as led:
        return led.read(
            lambda c: [dict(r) for r in c.execute(sa.text("SELECT * FROM audit_log ORDER BY seq")).mappings()]
        )


def forge_row(url: str, *, action: str, obj: str, payload: dict[str, Any], actor: str = "mallory") -> int:
    """Append a row as someone with write access to the database but no key would: a correct hash
    and link, no signature. Returns its seq."""
    rows = audit_rows(url)
    last = rows[-1]
    row = {"seq": last["seq"] + 1, "t": float(last["t"]) + 1, "actor": actor, "action": action, "object": obj,
           "payload": canonical_json(payload)}  # fmt: skip
    row["prev_hash"] = last["hash"]
    row["hash"] = row_hash(row, last["hash"])
    with Ledger(url) as led, led.database.engine.begin() as conn:
        columns = "seq, t, actor, action, object, payload, prev_hash, hash"
        values = ", ".join(f":{c.strip()}" for c in columns.split(","))
        conn.execute(sa.text(f"INSERT INTO audit_log ({columns}) VALUES ({values})"), row)
    return int(row["seq"])


def forged_reseal(url: str, run_id: str) -> int:
    """After editing a sealed run's rows: a reseal of the edited rows, forged without the key."""
    from gpuledger.store import audit

    with Ledger(url) as led:
        digest = led.read(lambda c: audit.current_seal(c, run_id))[0]  # type: ignore[index]
    return forge_row(url, action="run.resealed", obj=f"run:{run_id}", payload={"reason": "late push", "seal": digest})


def payload_of(row: dict[str, Any]) -> dict[str, Any]:
    return json.loads(row["payload"])
