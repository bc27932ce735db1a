"""A stored run log read back a piece at a time, for the server's ``GET /runs/{id}/log``.

``Ledger.get_log`` loads the stored form and the decoded log whole: six readers of a 95 MiB log
took a server from 190 to 823 MiB. Here the stored form (log_codec.py: the log, or its zlib
stream) is read ``chunk_b`` bytes per query and decompressed incrementally, each output piece at
most ``chunk_b`` bytes, so a reader costs a few chunks of memory whatever the log's size. One
connection and one read snapshot serve the whole stream (PostgreSQL: REPEATABLE READ; SQLite: its
read transaction), so a log replaced meanwhile is never mixed; the sha256 of what was sent is
checked against the row at the end, and a mismatch (a damaged row) ends the stream with an error.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import sqlalchemy as sa

from gpuledger.store import schema
from gpuledger.store.engine import Database
from gpuledger.store.errors import LedgerError

CHUNK_B = 1 << 20


@dataclass(frozen=True)
class LogInfo:
    size_b: int
    stored_b: int
    sha256: str


def _open(db: Database) -> sa.Connection:
    conn = db.engine.connect()
    if db.dialect == "postgresql":
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    return conn


class LogReader(Iterator[bytes]):
    """The log's pieces; ``close`` ends the read and returns the connection (also before the first
    piece, which a generator's close would not do)."""

    def __init__(self, conn: sa.Connection, pieces: Iterator[bytes]) -> None:
        self._conn = conn
        self._pieces = pieces

    def __next__(self) -> bytes:
        return next(self._pieces)

    def close(self) -> None:
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()
        self._conn.close()


def open_log(db: Database, run_id: str, chunk_b: int = CHUNK_B) -> tuple[LogInfo, LogReader] | None:
    """The log's size and sha256, and its bytes a piece at a time (close the reader), or None
    when the run has no log."""
    conn = _open(db)
    try:
        tx = conn.begin()
        lg = schema.logs.c
        q = sa.select(lg.size_b, sa.func.length(lg.data), lg.sha256).where(lg.run_id == run_id)
        row = conn.execute(q).first()
    except BaseException:
        conn.close()
        raise
    if row is None:
        conn.close()
        return None
    info = LogInfo(int(row[0]), int(row[1]), str(row[2]))
    return info, LogReader(conn, _pieces(conn, tx, run_id, info, chunk_b))


def _chunk_reader(conn: sa.Connection, run_id: str) -> Callable[[int, int], bytes]:
    """``read(at, n)``: n bytes of the stored form from ``at``. SQLite's substr() loads the whole
    value for every call, so there the blob is read incrementally (sqlite3's blobopen); PostgreSQL
    sends only the piece asked for."""
    lg = schema.logs.c
    if conn.dialect.name == "sqlite":
        rowid = conn.scalar(sa.select(sa.literal_column("rowid")).select_from(schema.logs).where(lg.run_id == run_id))
        blob = conn.connection.driver_connection.blobopen("logs", "data", rowid, readonly=True)  # type: ignore[union-attr]

        def read_blob(at: int, n: int) -> bytes:
            blob.seek(at)
            return blob.read(n)

        return read_blob

    def read_piece(at: int, n: int) -> bytes:
        q = sa.select(sa.func.substr(lg.data, at + 1, n)).where(lg.run_id == run_id)
        return bytes(conn.scalar(q) or b"")

    return read_piece


def _pieces(conn: sa.Connection, tx: sa.RootTransaction, run_id: str, info: LogInfo, chunk_b: int) -> Iterator[bytes]:
    plain = info.stored_b == info.size_b  # log_codec.py: stored as it is, else its zlib stream
    inflate = None if plain else zlib.decompressobj()
    digest = hashlib.sha256()
    sent = 0
    read = _chunk_reader(conn, run_id)
    try:
        for at in range(0, info.stored_b, chunk_b):
            stored = read(at, chunk_b)
            while stored:  # a MiB of progress bars inflates to tens of MiB: at most chunk_b out per step
                piece = stored if inflate is None else inflate.decompress(stored, chunk_b)
                stored = b"" if inflate is None else inflate.unconsumed_tail
                if piece:
                    digest.update(piece)
                    sent += len(piece)
                    yield piece
        rest = b"" if inflate is None else inflate.flush()
        if rest:
            digest.update(rest)
            sent += len(rest)
            yield rest
        if sent != info.size_b or digest.hexdigest() != info.sha256:
            raise LedgerError(f"the stored log of run {run_id} is damaged ({sent} bytes read, {info.size_b} expected)")
    except zlib.error as exc:
        raise LedgerError(f"the stored log of run {run_id} is damaged: {exc}") from None
    finally:
        if tx.is_active:
            tx.rollback()
        conn.close()
