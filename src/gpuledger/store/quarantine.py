"""Rows refused one by one: the server's quarantine, and the agent's record of what it was told.

Server side (``add`` / ``for_run``): a push whose run record is valid is stored without its bad
rows; those go to ``quarantined_rows`` with the reason, who sent them (user and token id) and the
row as sent (redacted, cut at 64 KiB), so an operator can see what was refused and why. A resent
batch adds nothing: one row per (run, list, sha256 of the item).

Agent side (``record_answer`` / ``for_server``): the rows a server said it quarantined, kept in
the local ledger beside the outbox, for ``gpuledger sync --status``.

When the run was last pushed (``run_liveness``, which the server's liveness sweep reads,
store/liveness_sweep.py) is noted by the push's own transaction (store/ingest.py); ``after_push``
notes it only when asked (``note``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import quarantine_audit, schema

if TYPE_CHECKING:
    from gpuledger.store import Ledger
    from gpuledger.store.engine import Database

MAX_PAYLOAD = 65536  # characters of a refused item kept (its sha256 covers all of it)


def _payload(raw: Any) -> str:
    return json.dumps(raw, sort_keys=True, separators=(",", ":"), default=str, allow_nan=True)


def after_push(
    db: Database,
    run_id: str,
    refused: Iterable[Mapping[str, Any]],
    *,
    actor: str,
    token_id: str,
    now: float | None = None,
    redact: Any = None,
    note: bool = True,
) -> None:
    """Note the push (``run_liveness``; not with ``note`` False: the push's own transaction noted
    it, store/ingest.py) and keep its refused rows, in one short transaction (none when there is
    nothing to write).

    ``refused``: dicts with series, item, reason and raw (the row as sent); ``redact`` (text ->
    text) is applied to the stored copy of each row."""
    now = time.time() if now is None else now
    rows = []
    for r in refused:
        text = _payload(r["raw"])
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        kept = redact(text) if redact is not None else text
        rows.append(
            {
                "run_id": run_id,
                "series": r["series"],
                "item": r["item"],
                "reason": r["reason"][:4096],
                "actor": actor,
                "token_id": token_id,
                "payload": kept[:MAX_PAYLOAD],
                "payload_sha256": digest,
                "received_at": now,
            }
        )

    from gpuledger.store import liveness_sweep  # the server's: audit (cryptography) stays out of the agent's imports

    def tx(conn: Connection) -> None:
        if note:
            liveness_sweep.note_push(conn, run_id, now)
        if rows:
            ins = db.insert(schema.quarantined_rows).on_conflict_do_nothing(
                index_elements=["run_id", "series", "payload_sha256"]
            )
            q = schema.quarantined_rows.c
            went_in = {tuple(r) for r in conn.execute(ins.returning(q.series, q.payload_sha256), rows)}
            # each row kept is evidence: in the audit trail, so a deleted or edited one shows
            kept = [r for r in rows if (r["series"], r["payload_sha256"]) in went_in]
            quarantine_audit.record(conn, run_id, kept, actor=actor)

    if note or rows:
        db.write(tx)


def for_run(conn: Connection, run_id: str, limit: int = 1000) -> list[dict[str, Any]]:
    """The run's quarantined rows, oldest first."""
    q = schema.quarantined_rows.c
    cols = (q.series, q.item, q.reason, q.actor, q.token_id, q.received_at, q.payload)
    sel = sa.select(*cols).where(q.run_id == run_id).order_by(q.received_at, q.id).limit(limit)
    return [dict(r) for r in conn.execute(sel).mappings()]


# -- agent side -----------------------------------------------------------------------------------


def record_answer(ledger: Ledger, server: str, run_id: str, items: Iterable[Mapping[str, Any]]) -> int:
    """Keep what ``server`` said it quarantined of ``run_id`` (a resent answer changes nothing)."""
    now = time.time()
    rows = {
        (str(i["series"]), str(i["item"])): {
            "server": server,
            "run_id": run_id,
            "series": str(i["series"])[:16],
            "item": str(i["item"]),
            "reason": str(i.get("reason", "")),
            "at": now,
        }
        for i in items
    }
    if not rows:
        return 0

    def tx(conn: Connection) -> None:
        ins = ledger.database.insert(schema.push_quarantine)
        update = {"reason": ins.excluded.reason, "at": ins.excluded.at}
        conn.execute(
            ins.on_conflict_do_update(index_elements=["server", "run_id", "series", "item"], set_=update),
            list(rows.values()),
        )

    ledger.write(tx)
    return len(rows)


def for_server(ledger: Ledger, server: str) -> dict[str, list[dict[str, Any]]]:
    """run id -> the rows ``server`` quarantined (series, item, reason), for ``sync --status``."""
    p = schema.push_quarantine.c
    q = sa.select(p.run_id, p.series, p.item, p.reason).where(p.server == server).order_by(p.run_id, p.at, p.item)
    out: dict[str, list[dict[str, Any]]] = {}
    for row in ledger.read(lambda c: list(c.execute(q).mappings())):
        out.setdefault(row["run_id"], []).append({k: row[k] for k in ("series", "item", "reason")})
    return out
