"""A server on a compact PostgreSQL series store starts while another client holds a transaction
open in the same database: the closed days' index rebuilds (``REINDEX CONCURRENTLY``, which waits
for every older transaction) run after the start, while the server serves, not before it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import test_series_tier as tiers
from docker_support import wait_for
from gpuledger.core.pricing.usage import DAY_S
from gpuledger.series import postgres_ddl
from gpuledger.store import Ledger, series_tier
from test_series_only import _server
from test_series_postgres import host_row, row

pytestmark = pytest.mark.postgres
pg_url = tiers.pg_url


@pytest.fixture
def store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "start_t")


def _key_compacted(url: str, day: int) -> bool:
    schema = url.split("schema=")[1]
    with psycopg.connect(tiers.PG, autocommit=True) as conn:
        name = postgres_ddl.days(conn, schema, "gpu_iv")[day]
        q = "SELECT coalesce(obj_description(to_regclass(%s), 'pg_class'), '') = 'compacted'"
        return bool(conn.execute(q, (f"{schema}.{name}_key",)).fetchone()[0])  # type: ignore[index]


def closed_day(store_url: str) -> int:
    """The store made, with rows of a day that ended long ago (its key index is due a rebuild)."""
    day = int(time.time() // DAY_S) - 3
    store = series_tier.open_store(store_url, create=True)
    try:
        start = day * DAY_S + 3600.0
        gpu = [row("GPU-old", i, start + 5.0 * i) for i in range(10)]
        store.write("old-run", gpu, [host_row(i, start + 5.0 * i) for i in range(10)], token="old")
    finally:
        store.close()
    return day


def test_a_server_starts_while_a_transaction_is_left_open_and_compacts_once_it_ends(
    pg_url: str, store_url: str, tmp_path: Path
) -> None:
    day = closed_day(store_url)
    assert not _key_compacted(store_url, day)
    Ledger(pg_url).close()  # migrated: serve never migrates a shared ledger
    with psycopg.connect(tiers.PG) as idle:  # a client's transaction left open, holding its snapshot
        idle.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        idle.execute("SELECT txid_current()")
        with _server(pg_url, store_url, tmp_path, only=False) as server:  # started: /healthz answered
            assert server.proc.poll() is None
            assert not _key_compacted(store_url, day)  # still waiting for the open transaction
            idle.rollback()
            # the rebuild goes on once it ended
            wait_for(lambda: _key_compacted(store_url, day), 120, 0.2, "the closed day's index rebuilt")
