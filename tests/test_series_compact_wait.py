"""The compact PostgreSQL series store's index rebuild of closed days (``REINDEX CONCURRENTLY``,
series/postgres_ddl.compact_before) never holds ``retention run`` or the server's hourly pass
behind a transaction some other client left open: it waits a bounded time, leaves the rebuild
for the next pass, and leaves no half-built index behind (a cancelled ``REINDEX CONCURRENTLY``
leaves an invalid ``…_ccnew`` copy that every insert would keep writing). On the real server.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import test_series_tier as tiers
from gpuledger.series import postgres_ddl
from test_series_start_unblocked import _key_compacted, closed_day

pytestmark = pytest.mark.postgres


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "wait_t")


def _indexes(schema: str, day: int) -> dict[str, bool]:
    """index name -> valid, of the day's GPU partition."""
    with psycopg.connect(tiers.PG, autocommit=True) as conn:
        part = postgres_ddl.days(conn, schema, "gpu_iv")[day]
        q = (
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE i.indrelid = to_regclass(%s)"
        )
        return dict(conn.execute(q, (f"{schema}.{part}",)).fetchall())


def _compact(schema: str, cut: int, wait_s: float) -> list[str]:
    """compact_before in a thread; fails (instead of hanging the suite) if it is still waiting
    long after ``wait_s``."""
    out: list[list[str]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            with psycopg.connect(tiers.PG, autocommit=True) as conn:
                out.append(postgres_ddl.compact_before(conn, schema, cut, wait_s=wait_s))
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(wait_s + 120)
    assert not worker.is_alive(), "the index rebuild still waits for the open transaction"
    if errors:
        raise errors[0]
    return out[0]


def _left_open() -> psycopg.Connection:
    """A client's transaction left open on another table, holding its snapshot."""
    idle = psycopg.connect(tiers.PG)
    idle.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    idle.execute("SELECT txid_current()")
    return idle


def test_a_rebuild_behind_an_open_transaction_is_left_for_the_next_pass_without_a_half_built_index(
    store_url: str,
) -> None:
    schema, day = store_url.split("schema=")[1], closed_day(store_url)
    idle = _left_open()
    try:
        assert _compact(schema, day + 1, wait_s=1.0) == []  # given up, not waiting on
        assert not _key_compacted(store_url, day)
        assert all(_indexes(schema, day).values()), _indexes(schema, day)  # no invalid _ccnew left
    finally:
        idle.close()
    done = _compact(schema, day + 1, wait_s=30.0)  # the next pass, nothing open: rebuilt
    assert any(name.endswith("_key") for name in done) and _key_compacted(store_url, day)
    assert all(_indexes(schema, day).values())


def test_a_half_built_index_an_earlier_cancelled_rebuild_left_is_dropped_by_the_next_pass(store_url: str) -> None:
    schema, day = store_url.split("schema=")[1], closed_day(store_url)
    with psycopg.connect(tiers.PG, autocommit=True) as conn:
        part = postgres_ddl.days(conn, schema, "gpu_iv")[day]
        idle = _left_open()
        try:  # a rebuild cancelled the way compact_before's is, by some other process
            conn.execute("SET lock_timeout = 500")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                conn.execute(f"REINDEX INDEX CONCURRENTLY {schema}.{part}_key")
        finally:
            idle.close()
    assert not all(_indexes(schema, day).values())  # the invalid copy is there
    _compact(schema, day + 1, wait_s=30.0)
    assert all(_indexes(schema, day).values()) and _key_compacted(store_url, day), _indexes(schema, day)
