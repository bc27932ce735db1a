"""The tamper-evident audit trail: appending to the hash chain and sealing runs (docs/AUDIT.md).

Every change the team server makes (run created / changed / ended, token issued / revoked, rate
card changed, rollups, retention deletes, owners) is appended with ``append`` inside the
transaction that makes the change, signed with the writer's audit key (store/audit_sign.py). A
finished run is *sealed*: a digest of its rows (core/audit/seal.py) goes into the chain; a later
legitimate change (a late push, a rollup) appends a new seal. ``verify`` (store/audit_verify.py)
checks the signatures and the chain, recomputes every sealed run and names each row that differs.

Appends are serialised per ledger (PostgreSQL: a transaction-scoped advisory lock; SQLite: the
write lock), so several server replicas extend one chain.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit.chain import GENESIS, canonical_json, row_hash
from gpuledger.store import audit_checkpoint, audit_seals, audit_sign, audit_verify, schema
from gpuledger.store.audit_verify import Verification

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

_PG_LOCK_KEY = 0x67707501
SEAL_ACTIONS = ("run.sealed", "run.resealed")
DELETE_ACTIONS = ("run.deleted",)
T = schema


def lock(conn: Connection) -> None:
    """Serialise with every other writer of the chain until the caller's transaction ends (on
    PostgreSQL; a SQLite write transaction already is)."""
    _lock(conn)


def _lock(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(
            sa.text("SELECT pg_advisory_xact_lock(:k, hashtext(coalesce(current_schema(), '')))"), {"k": _PG_LOCK_KEY}
        )


def append(
    conn: Connection,
    *,
    actor: str,
    action: str,
    obj: str,
    payload: Mapping[str, Any] | None = None,
    t: float | None = None,
) -> int:
    """Append one row to the chain in the caller's transaction, signed with this process's audit
    key when it has one (store/audit_sign.py); returns its seq."""
    _lock(conn)
    keys = audit_sign.writer_keys()
    last = audit_sign.head(conn)
    audit_checkpoint.check_floor(conn, last)  # never extend a chain shortened below the checkpoint
    unsigned = audit_sign.trusted_head(conn, last, keys)
    if unsigned is not None:  # rows written without the key: named, signed, before anything else
        first, upto = unsigned
        marker = {"first": first, "last": upto, "found_by": keys.signer.key_id if keys else None}
        last = _insert(conn, last, keys, actor=actor, action=audit_sign.UNSIGNED_ROWS, obj="audit_log", payload=marker)
    return _insert(conn, last, keys, actor=actor, action=action, obj=obj, payload=payload, t=t).seq


def _insert(
    conn: Connection,
    last: audit_sign.Head | None,
    keys: audit_sign.WriterKeys | None,
    *,
    actor: str,
    action: str,
    obj: str,
    payload: Mapping[str, Any] | None,
    t: float | None = None,
) -> audit_sign.Head:
    seq, prev = (1, GENESIS) if last is None else (last.seq + 1, last.hash)
    row: dict[str, Any] = {
        "seq": seq,
        "t": time.time() if t is None else float(t),
        "actor": actor,
        "action": action,
        "object": obj,
        "payload": canonical_json(dict(payload or {})),
    }
    row["prev_hash"] = prev
    row["hash"] = row_hash(row, prev)
    row["key_id"] = row["sig"] = None
    if keys is not None:
        row["key_id"], row["sig"] = keys.signer.key_id, keys.signer.sign(seq, row["hash"])
        audit_sign.remember(conn, seq, row["hash"])
    conn.execute(sa.insert(T.audit_log).values(row))
    return audit_sign.Head(seq, row["hash"], row["key_id"], row["sig"])


def start_signing(ledger: Ledger, *, actor: str) -> int:
    """Begin signing a chain written without a key (an upgraded ledger): one signed row that names
    the unsigned rows before it. They stay "hash chain only" (docs/AUDIT.md)."""
    keys = audit_sign.writer_keys()
    if keys is None:
        raise audit_sign.AuditKeyError(
            f"set {audit_sign.ENV_KEY_FILE} to the audit key first (gpuledger audit key new)"
        )

    def tx(conn: Connection) -> int:
        _lock(conn)
        last = audit_sign.head(conn)
        a = T.audit_log.c
        signed = conn.scalar(sa.select(sa.func.count()).select_from(T.audit_log).where(a.key_id.is_not(None)))
        if signed:
            raise audit_sign.AuditKeyError("this audit trail is signed already; nothing to start")
        payload = {"key_id": keys.signer.key_id, "public_key": keys.signer.public.text,
                   "unsigned_before": 1 if last is None else last.seq + 1}  # fmt: skip
        return _insert(conn, last, keys, actor=actor, action=audit_sign.SIGNING_STARTED, obj="audit_log",
                       payload=payload).seq  # fmt: skip

    return ledger.write(tx)


def record_change(
    ledger: Ledger, *, actor: str, action: str, obj: str, payload: Mapping[str, Any] | None = None
) -> int:
    """Append one audit row in its own transaction: the entry point for other modules
    (e.g. ``action="rate_card.changed", obj="rate_card:<name>", payload={"sha256": ...}``)."""
    return ledger.write(lambda conn: append(conn, actor=actor, action=action, obj=obj, payload=payload))


def rate_card_changed(ledger: Ledger, *, actor: str, name: str, text: str) -> int | None:
    """Record a rate card's content when it differs from the last one recorded under ``name``;
    None when unchanged. Call it wherever a rate card is loaded for billing."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    obj = f"rate_card:{name}"

    def tx(conn: Connection) -> int | None:
        _lock(conn)
        a = T.audit_log.c
        q = sa.select(a.payload).where(a.object == obj, a.action == "rate_card.changed").order_by(a.seq.desc()).limit(1)
        last = conn.scalar(q)
        if last is not None and canonical_json({"sha256": digest, "size_b": len(text)}) == last:
            return None
        return append(
            conn, actor=actor, action="rate_card.changed", obj=obj, payload={"sha256": digest, "size_b": len(text)}
        )

    return ledger.write(tx)


# -- seals ----------------------------------------------------------------------------------------


def current_seal(conn: Connection, run_id: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | None:
    """The run's seal computed from its rows now, and the rows per series; None if no such run."""
    return audit_seals.current_seal(conn, run_id)


def latest_seal(conn: Connection, run_id: str) -> dict[str, Any] | None:
    a = T.audit_log.c
    q = (
        sa.select(a.payload)
        .where(a.object == f"run:{run_id}", a.action.in_(SEAL_ACTIONS))
        .order_by(a.seq.desc())
        .limit(1)
    )
    text = conn.scalar(q)
    return None if text is None else json.loads(text)["seal"]


def seal_run(conn: Connection, run_id: str, *, actor: str, reason: str = "run ended") -> int | None:
    """Seal the run (or reseal it when its rows changed since the last seal); None if unchanged."""
    found = current_seal(conn, run_id)
    if found is None:
        return None
    digest, _ = found
    _lock(conn)  # serialise with other sealers of this run before reading the last seal
    previous = latest_seal(conn, run_id)
    if previous == digest:
        return None
    action = "run.sealed" if previous is None else "run.resealed"
    return append(conn, actor=actor, action=action, obj=f"run:{run_id}", payload={"reason": reason, "seal": digest})


def verify(ledger: Ledger, *, expect_head: str | None = None, **options: Any) -> Verification:
    """The ledger checked against its trail (store/audit_verify.py)."""
    return audit_verify.verify(ledger, expect_head=expect_head, **options)
