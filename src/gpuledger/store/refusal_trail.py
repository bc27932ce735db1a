"""``push.refused`` audit rows, at most one per token per window.

Each refused push (store/ingest.py's PushRefused: a rewrite of a finished run, another host's
GPU ...) used to append its own signed row, so a token sending the same bad push in a loop grew
the trail without bound. Now a token's refusal gets a row only when its previous row is at least
``WINDOW_S`` old; refusals in between are counted (``refusal_folds``), and the next row carries
that count as ``folded`` (the refusals it stands for besides its own). The rows are ordinary chain
rows, so the trail still verifies; what is folded is the count, the first refusal's reason stays.
The check and the append share one write transaction, so replicas never both write in a window.
The window is ``GPULEDGER_REFUSED_AUDIT_WINDOW_S`` seconds (default 60; 0 gives every refusal its
own row, as before).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import audit, schema

if TYPE_CHECKING:
    from gpuledger.store.engine import Database

WINDOW_S = 60.0
WINDOW_ENV = "GPULEDGER_REFUSED_AUDIT_WINDOW_S"


def window_s() -> float:
    text = os.environ.get(WINDOW_ENV, "").strip()
    try:
        return float(text) if text else WINDOW_S
    except ValueError:
        raise ValueError(f"{WINDOW_ENV}={text!r}: expected a number of seconds") from None


def refused(
    db: Database, *, run_id: str, actor: str, token_id: str | None, reason: str, now: float | None = None,
    window: float | None = None,
) -> bool:  # fmt: skip
    """Record one refusal; True when it appended a row, False when it was folded into the next."""
    now = time.time() if now is None else now
    window = window_s() if window is None else window
    key = token_id or ""
    f = schema.refusal_folds

    def tx(conn: Connection) -> bool:
        if db.dialect == "postgresql":  # one writer per token at a time
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(0x67707501, sa.func.hashtext(key))))
        row = conn.execute(sa.select(f.c.row_at, f.c.folded).where(f.c.token_id == key)).first()
        if row is not None and 0 <= now - row.row_at < window:
            conn.execute(sa.update(f).where(f.c.token_id == key).values(folded=f.c.folded + 1))
            return False
        payload: dict[str, Any] = {"reason": reason, "token": token_id or None}
        if row is not None and row.folded:
            payload["folded"] = int(row.folded)
        audit.append(conn, actor=actor, action="push.refused", obj=f"run:{run_id}", payload=payload)
        ins = db.insert(f).values(token_id=key, row_at=now, folded=0)
        conn.execute(ins.on_conflict_do_update(index_elements=["token_id"], set_={"row_at": now, "folded": 0}))
        return True

    return bool(db.write(tx))
