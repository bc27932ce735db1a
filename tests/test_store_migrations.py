"""Schema versioning: fresh databases, reopening, pending / failing migrations, foreign schemas."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from gpuledger.store import Ledger, LedgerError, SchemaOutdated, SchemaTooNew, migrations, schema
from gpuledger.store.engine import Database
from gpuledger.store.migrations import LATEST, MIGRATIONS, Migration
from test_store_records import full_gpu, full_run, run_id


def _versions(url: str) -> list[int]:
    db = Database(url)
    try:
        return db.read(lambda c: list(c.scalars(sa.select(schema.schema_version.c.version).order_by("version"))))
    finally:
        db.close()


def _table_names(url: str) -> set[str]:
    """The ledger's tables; on PostgreSQL not the partitions of its partitioned tables (their rows
    are the parent's: store/partitions.py)."""
    db = Database(url)
    parts = "SELECT relname FROM pg_class WHERE relispartition AND relnamespace = current_schema()::regnamespace"
    try:
        return db.read(
            lambda c: (
                set(sa.inspect(c).get_table_names())
                - (set(c.exec_driver_sql(parts).scalars()) if c.dialect.name == "postgresql" else set())
            )
        )
    finally:
        db.close()


def test_fresh_database_gets_every_table(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        assert led.schema_version() == LATEST
    assert _table_names(ledger_url) == set(schema.metadata.tables)
    assert _versions(ledger_url) == [m.version for m in MIGRATIONS]


def test_reopening_keeps_data_and_does_not_migrate_again(ledger_url: str) -> None:
    run = full_run(run_id(1))
    with Ledger(ledger_url) as led:
        led.create_run(run)
        led.append(run.id, [full_gpu("GPU-a", 0)])
    for migrate in (True, False):
        with Ledger(ledger_url, migrate=migrate) as led:
            assert led.get_run(run.id) == run and len(led.gpu_intervals(run.id)) == 1
    assert _versions(ledger_url) == [m.version for m in MIGRATIONS]


def test_newer_schema_is_refused(ledger_url: str) -> None:
    Ledger(ledger_url).close()
    db = Database(ledger_url)
    db.write(
        lambda c: c.execute(
            sa.insert(schema.schema_version), {"version": LATEST + 1, "applied_at": 0.0, "description": "future"}
        )
    )
    db.close()
    for migrate in (True, False):
        with pytest.raises(SchemaTooNew, match=r"newer .*upgrade gpuledger"):
            Ledger(ledger_url, migrate=migrate)


def test_outdated_schema_without_migrate(ledger_url: str) -> None:
    with pytest.raises(SchemaOutdated, match="gpuledger db migrate") as err:
        Ledger(ledger_url, migrate=False)
    assert f"version 0 but this gpuledger needs {LATEST}" in str(err.value)
    assert _table_names(ledger_url) == set()  # nothing was created behind the server's back


def _add_column(conn: sa.Connection) -> None:
    conn.execute(sa.text("ALTER TABLE runs ADD COLUMN cost_centre TEXT"))


def test_pending_migrations_apply_once_in_order(ledger_url: str) -> None:
    Ledger(ledger_url).close()
    v2 = Migration(LATEST + 1, "add runs.cost_centre", _add_column)
    db = Database(ledger_url)
    try:
        assert migrations.upgrade(db, (*MIGRATIONS, v2)) == LATEST + 1
        assert migrations.upgrade(db, (*MIGRATIONS, v2)) == LATEST + 1  # already there: no-op
        columns = db.read(lambda c: {col["name"] for col in sa.inspect(c).get_columns("runs")})
        assert "cost_centre" in columns
    finally:
        db.close()
    assert _versions(ledger_url) == [*(m.version for m in MIGRATIONS), LATEST + 1]


def test_failing_migration_leaves_the_previous_version(ledger_url: str) -> None:
    Ledger(ledger_url).close()

    def broken(conn: sa.Connection) -> None:
        conn.execute(sa.text("CREATE TABLE half_done (x INTEGER)"))
        raise RuntimeError("migration bug")

    db = Database(ledger_url)
    try:
        with pytest.raises(RuntimeError, match="migration bug"):
            migrations.upgrade(db, (*MIGRATIONS, Migration(LATEST + 1, "broken", broken)))
    finally:
        db.close()
    assert _versions(ledger_url) == [m.version for m in MIGRATIONS]
    assert "half_done" not in _table_names(ledger_url)  # DDL rolled back with the transaction


def test_foreign_database_is_refused(ledger_url: str) -> None:
    db = Database(ledger_url)
    db.write(lambda c: c.execute(sa.text("CREATE TABLE runs (id TEXT PRIMARY KEY)")))
    db.close()
    with pytest.raises(LedgerError, match="not a gpuledger ledger"):
        Ledger(ledger_url)
