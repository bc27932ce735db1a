"""The server's quarantine (``quarantined_rows``) in the audit trail: a refused row is evidence of
what an agent sent and why it was not stored, so deleting or rewriting one with SQL must show.

Each push that quarantines new rows appends one ``push.quarantined`` row naming the run and, per
row kept, a digest of everything stored of it (list, item, reason, sender, the row as sent, when).
``gpuledger audit verify`` replays them and names a row deleted, edited, or inserted outside
gpuledger (rows kept before quarantines were audited are not named as inserted). A run deleted
by retention takes its quarantine with it (its ``run.deleted`` entry says so).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import rollup_audit, schema

__all__ = ["ACTION", "QuarantineTrail", "check", "digest", "record"]

ACTION = "push.quarantined"
COLUMNS = ("series", "item", "reason", "actor", "token_id", "payload", "payload_sha256", "received_at")


def _key(row: Mapping[str, Any]) -> str:
    return f"{row['series']}:{row['payload_sha256']}"


def digest(row: Mapping[str, Any]) -> str:
    """One kept row, as the same text from either database."""
    values = [float(row[c]) if c == "received_at" else str(row[c]) for c in COLUMNS]
    return hashlib.sha256(repr(values).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def record(conn: Connection, run_id: str, kept: Sequence[Mapping[str, Any]], *, actor: str) -> None:
    """In the transaction that kept ``kept`` (rows of ``quarantined_rows`` that went in)."""
    if not kept or not rollup_audit.audited(conn):
        return  # nothing new, or a local ledger (no trail)
    from gpuledger.store import audit  # audit -> audit_verify -> audit_state imports this module

    at = min(float(r["received_at"]) for r in kept)  # from here on, every kept row is in the trail
    payload = {"rows": {_key(r): digest(r) for r in kept}, "received_at": at}
    audit.append(conn, actor=actor, action=ACTION, obj=f"run:{run_id}", payload=payload)


@dataclass
class QuarantineTrail:
    runs: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)  # run -> key -> (digest, seq)
    since: float | None = None  # when the first quarantine was audited

    def feed(self, seq: int, run_id: str, payload: Mapping[str, Any]) -> None:
        rows, at = payload.get("rows"), payload.get("received_at")
        if isinstance(rows, dict):
            if self.since is None and isinstance(at, (int, float)):
                self.since = float(at)
            kept = self.runs.setdefault(run_id, {})
            kept.update({str(k): (str(v), seq) for k, v in rows.items()})

    def deleted(self, run_id: str) -> None:
        self.runs.pop(run_id, None)


def check(conn: Connection, trail: QuarantineTrail) -> list[str]:
    """``quarantined_rows`` against the trail: each row deleted, edited or inserted outside gpuledger."""
    if trail.since is None:
        return []  # never audited: a ledger from before (its next quarantine starts the record)
    q = schema.quarantined_rows.c
    out: list[str] = []
    now: dict[str, dict[str, Mapping[str, Any]]] = {}
    for row in conn.execute(sa.select(q.run_id, *(q[c] for c in COLUMNS))).mappings():
        now.setdefault(row["run_id"], {})[_key(row)] = row
    for run_id in sorted(set(now) | set(trail.runs)):
        rows, said = now.get(run_id, {}), trail.runs.get(run_id, {})
        for key in sorted(set(rows) | set(said)):
            row, was = rows.get(key), said.get(key)
            where = f"quarantined_rows of run {run_id}: {key.split(':')[0]} row"
            if was is None:
                if float(row["received_at"]) >= trail.since:  # type: ignore[index]
                    out.append(f"{where} {row['item']!r} is not in the audit trail (inserted outside gpuledger)")  # type: ignore[index]
            elif row is None:
                out.append(f"{where} kept at audit seq {was[1]} was deleted outside gpuledger")
            elif digest(row) != was[0]:
                out.append(f"{where} {row['item']!r} was edited (differs from what audit seq {was[1]} kept)")
    return out
