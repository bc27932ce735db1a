"""How a SQLite ledger's connection is set up and how its errors read, for both writers of it.

SQLAlchemy's engine (store/engine.py) and the standard-library writer of ``gpuledger run``
(store/run_writer.py) open the same files: they must agree on WAL, ``synchronous``, foreign keys
and the busy timeout, and on which driver errors mean "the ledger cannot be opened".
"""

from __future__ import annotations

from typing import Any

# Driver messages (lower case) that mean the file cannot be opened or written at all.
UNAVAILABLE = ("unable to open", "readonly", "disk i/o", "not a database", "disk is full")


def set_up(dbapi_conn: Any, busy_ms: int, wal: bool) -> None:
    """Autocommit (BEGIN is sent by the writer), busy timeout, foreign keys, WAL for a file."""
    dbapi_conn.isolation_level = None  # take transaction control from the sqlite3 module
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
        cur.execute("PRAGMA foreign_keys = ON")
        if wal and cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            cur.execute("PRAGMA journal_mode = WAL")  # persistent: done once per file
        cur.execute("PRAGMA synchronous = NORMAL")
    finally:
        cur.close()


def is_locked(message: str) -> bool:
    """A lock another writer holds (wait and retry), not a fault."""
    text = message.lower()
    return "locked" in text or "busy" in text


def is_unavailable(message: str) -> bool:
    text = message.lower()
    return any(s in text for s in UNAVAILABLE)
