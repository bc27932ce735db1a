"""The recorder's usual flush on SQLite: intervals of a run still being recorded, in one DBAPI transaction.

A recording run writes its GPU and host intervals every few seconds. For a run that is still
open that write is exactly: look up the run, insert the rows (``ON CONFLICT DO NOTHING``); nothing
can have been rolled up from it yet (writes.append). On SQLite this does that on a pooled DBAPI
connection (``Database.write_dbapi``: ``BEGIN IMMEDIATE``, retried while locked, errors translated)
with SQLAlchemy's compiled statements and bind processors (direct_insert.py), because there
SQLAlchemy's connection, transaction and statement machinery cost more CPU than the writes.

Anything else (a run that ended or is gone, events or metrics to number, PostgreSQL) is declined
and goes through writes.append as before.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuledger.core.model import GpuInterval, HostInterval, run_is_open
from gpuledger.store import schema
from gpuledger.store.codec import to_row
from gpuledger.store.engine import Database

_RUN_STATE = "SELECT status, ended_at FROM runs WHERE id = ?"


def append_to_open_run(db: Database, run_id: str, gpu: Sequence[GpuInterval], host: Sequence[HostInterval]) -> bool:
    """Store the intervals if the run exists and is open; False (nothing written): not this case."""
    if db.dialect != "sqlite":
        return False

    def tx(cursor: object) -> bool:
        state = cursor.execute(_RUN_STATE, (run_id,)).fetchone()  # type: ignore[attr-defined]
        if state is None or not run_is_open(state[0], state[1]):
            return False
        for table, records in ((schema.gpu_intervals, gpu), (schema.host_intervals, host)):
            if records:
                rows = [to_row(r, run_id=run_id) for r in records]
                if not db.direct.execute_on(cursor, db.insert_new(table), table, rows):
                    raise _NotDirect  # rolled back: the general path writes it all
        return True

    try:
        return db.write_dbapi(tx)
    except _NotDirect:
        return False


class _NotDirect(Exception):
    """A batch the cursor cannot take as SQLAlchemy would (rows with differing columns)."""
