"""The tamper-evident audit trail: appending to the hash chain, sealing runs, verifying both.

Every change the team server makes (run created / ended / labels changed, token issued / revoked,
rate card changed, rollups, retention deletes) is appended with ``append`` inside the transaction
that makes the change. A finished run is *sealed*: a digest of its rows (core/seal.py) goes into
the chain; a later legitimate change (a late push, a rollup) appends a new seal. ``verify`` checks
the chain, then recomputes every run's seal and names each row that differs.

Appends are serialised per ledger (PostgreSQL: a transaction-scoped advisory lock; SQLite: the
write lock), so several server replicas extend one chain.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core import seal as seals
from gpuledger.core.audit_chain import GENESIS, canonical_json, check_chain, row_hash
from gpuledger.store import audit_sign, schema

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

_PG_LOCK_KEY = 0x67707501
SEAL_ACTIONS = ("run.sealed", "run.resealed")
DELETE_ACTIONS = ("run.deleted",)
T = schema


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


def _rows(conn: Connection, table: sa.Table, run_id: str, drop: tuple[str, ...] = ("run_id",)) -> list[dict[str, Any]]:
    q = sa.select(*(c for c in table.c if c.name not in drop)).where(table.c.run_id == run_id)
    return [dict(r) for r in conn.execute(q).mappings()]


def current_seal(conn: Connection, run_id: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]] | None:
    """The run's seal computed from its rows now, and the rows per series; None if no such run."""
    run = conn.execute(sa.select(T.runs).where(T.runs.c.id == run_id)).mappings().first()
    if run is None:
        return None
    gpu = _rows(conn, T.gpu_intervals, run_id)
    host = _rows(conn, T.host_intervals, run_id)
    log = conn.scalar(sa.select(T.logs.c.data).where(T.logs.c.run_id == run_id))
    digest = seals.seal(
        dict(run),
        _rows(conn, T.run_labels, run_id),
        _rows(conn, T.devices, run_id),
        gpu,
        host,
        _rows(conn, T.events, run_id),
        _rows(conn, T.metrics, run_id),
        None if log is None else hashlib.sha256(bytes(log)).hexdigest(),
    )
    by_series: dict[str, list[dict[str, Any]]] = {"host_intervals": host}
    for r in gpu:
        by_series.setdefault(f"gpu_intervals/{r['device_uuid']}", []).append(r)
    return digest, by_series


def latest_seal(conn: Connection, run_id: str) -> dict[str, Any] | None:
    import json

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


def seal_unsealed(ledger: Ledger, *, actor: str) -> list[str]:
    """Seal every finished run that has no seal yet (agents that never sent their last batch)."""
    a = T.audit_log.c
    sealed = sa.select(sa.func.substr(a.object, 5)).where(a.action.in_(SEAL_ACTIONS))
    q = sa.select(T.runs.c.id).where(T.runs.c.status != "running", T.runs.c.id.not_in(sealed))
    ids = ledger.read(lambda conn: list(conn.scalars(q)))
    for run_id in ids:
        ledger.write(lambda conn, r=run_id: seal_run(conn, r, actor=actor, reason="sealed later"))
    return ids


# -- verify ---------------------------------------------------------------------------------------


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    rows: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS
    runs_checked: int = 0
    unsealed_running: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(ledger: Ledger, *, expect_head: str | None = None) -> Verification:
    """Check the chain, then every run against its latest seal. ``expect_head``: ``seq:hash`` of
    a head recorded earlier outside the database; it must still be in the chain."""
    return ledger.read(lambda conn: _verify(conn, expect_head))


def _verify(conn: Connection, expect_head: str | None) -> Verification:
    import json

    out = Verification()
    a = T.audit_log.c
    rows = [dict(r) for r in conn.execute(sa.select(T.audit_log).order_by(a.seq)).mappings()]
    out.rows = len(rows)
    out.problems += [p.message for p in check_chain(rows)]
    if rows:
        out.head_seq, out.head_hash = int(rows[-1]["seq"]), str(rows[-1]["hash"])
    if expect_head:
        seq_text, _, want = expect_head.partition(":")
        match = [r for r in rows if str(r["seq"]) == seq_text.strip()]
        if not match or match[0]["hash"] != want.strip():
            out.problems.append(f"audit_log: the recorded head {expect_head} is no longer in the chain (rows removed)")
    seals_of: dict[str, tuple[int, dict[str, Any]]] = {}
    created: set[str] = set()
    deleted: dict[str, int] = {}
    for r in rows:
        obj = str(r["object"])
        if not obj.startswith("run:"):
            continue
        run_id = obj[4:]
        if r["action"] in SEAL_ACTIONS:
            try:
                seals_of[run_id] = (int(r["seq"]), json.loads(r["payload"])["seal"])
            except (ValueError, KeyError, TypeError):
                continue  # already reported: an edited row
        elif r["action"] == "run.created":
            created.add(run_id)
        elif r["action"] in DELETE_ACTIONS:
            deleted[run_id] = int(r["seq"])
    present = {str(r.id): str(r.status) for r in conn.execute(sa.select(T.runs.c.id, T.runs.c.status))}
    for run_id, (seq, sealed) in sorted(seals_of.items()):
        if run_id not in present:
            if deleted.get(run_id, 0) < seq:
                out.problems.append(f"run {run_id}: deleted (sealed at audit seq {seq}; no run.deleted entry)")
            continue
        if deleted.get(run_id, 0) > seq:
            out.problems.append(f"run {run_id}: present again after its run.deleted entry")
        found = current_seal(conn, run_id)
        assert found is not None
        out.runs_checked += 1
        for diff in seals.compare(sealed, found[0], found[1]):
            out.problems.append(f"run {run_id}: {diff}")
    for run_id, status in sorted(present.items()):
        if run_id in seals_of:
            continue
        if run_id not in created:
            out.problems.append(f"run {run_id}: inserted outside gpuledger (no run.created entry in the audit log)")
        elif status == "running":
            out.unsealed_running += 1
        else:
            out.problems.append(f"run {run_id}: {status} but never sealed (run `gpuledger audit seal`)")
    for run_id in sorted(created - set(present) - set(deleted)):
        if run_id not in seals_of:
            out.problems.append(f"run {run_id}: deleted (created in the audit log; no run.deleted entry)")
    return out
