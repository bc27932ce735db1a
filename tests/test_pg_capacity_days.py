"""PostgreSQL: the node agents' capacity intervals partitioned by UTC day (migration 21); retention
drops whole capacity days past ``--capacity-days``, never a DELETE (store/capacity_days_drop.py).

On the real PostgreSQL server (a private schema per test) with capacity pushed by enrolled nodes
through the server: the capacity report and its FOCUS output are the same before and after the
drop, no DELETE on ``gpu_capacity`` is issued (every statement of the run captured), the trail
records each day dropped and ``audit verify`` passes before and after; a day one host's rows of
which the series store does not hold exactly is kept whole; migration 21 converts a populated
ledger keeping every row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import statement_support
import test_series_tier as tiers
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, States
from gpuledger.series import capacity
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import (
    Ledger,
    audit,
    capacity_days_drop,
    capacity_tier,
    migrations,
    partitions,
    schema,
    series_tier,
)
from gpuledger.store.capacity import write_capacity
from gpuledger.store.capacity_queries import intervals
from gpuledger.store.engine import Database
from server_support import bearer, enroll, setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY
from test_series_capacity import GPUS, HOST, MIDNIGHT_MS, _cli, _wire

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
statements = statement_support.statements
HOST2 = "node-2"
GPUS2 = ("GPU-n2-0", "GPU-n2-1")
RECENT_MS = (TODAY - 1) * DAY_MS + 3_600_000  # yesterday 01:00: inside a one-day capacity window
DELETE_CAPACITY = re.compile(r"\bDELETE\s+FROM\s+gpu_capacity(_p\d+|_default)?\b", re.IGNORECASE)


def _host2(wire: list[list[Any]]) -> list[list[Any]]:
    """The same intervals as node-2's GPUs, from the midnight on (one day only)."""
    names = dict(zip(GPUS, GPUS2, strict=True))
    return [[names[r[0]], HOST2, *r[2:]] for r in wire if r[2] >= MIDNIGHT_MS]


def _recent(wire: list[list[Any]]) -> list[list[Any]]:
    """node-1's intervals moved to yesterday: newer than the cut, they stay."""
    return [[r[0], r[1], r[2] - MIDNIGHT_MS + RECENT_MS, r[3] - MIDNIGHT_MS + RECENT_MS, *r[4:]] for r in wire[:6]]


def _sightings(host: str, gpus: tuple[str, ...]) -> list[dict[str, Any]]:
    first, last = (MIDNIGHT_MS - 600_000) / 1000, (RECENT_MS + 600_000) / 1000
    return [{"uuid": g, "name": "NVIDIA L4", "host": host, "first_seen": first, "last_seen": last} for g in gpus]


def _populate(pg_url: str) -> dict[str, list[list[Any]]]:
    """Two enrolled nodes push their capacity through the server: node-1 on both sides of the midnight
    three days ago and yesterday, node-2 after that midnight. The rows pushed, per part."""
    setup_accounts(pg_url)
    with Ledger(pg_url) as led:  # the days' partitions, as the server's hourly pass made them back then
        partitions.maintain(led.database, now=MIDNIGHT_MS / 1000)
    tokens = {HOST: enroll(pg_url, HOST), HOST2: enroll(pg_url, HOST2)}
    wire = _wire()
    parts = {"old1": wire, "old2": _host2(wire), "recent": _recent(wire)}
    with TestClient(create_app(pg_url, settings=Settings(close_after_days=OPEN_DAYS))) as client:
        for host, gpus, rows in ((HOST, GPUS, parts["old1"] + parts["recent"]), (HOST2, GPUS2, parts["old2"])):
            body = {"intervals": rows, "gpus": _sightings(host, gpus)}
            got = client.post("/api/v1/capacity", json=body, headers=bearer(tokens[host]))
            assert got.status_code == 200 and got.json()["stored"] == len(rows), got.text
    return parts


def _reports(pg_url: str, tmp_path: Path) -> tuple[Any, str]:
    """The capacity report (JSON, per host and GPU) and its FOCUS dataset over all the pushed days."""
    window = ["--from", tiers._date(TODAY - 5), "--to", tiers._date(TODAY - 1), "--db", pg_url]
    report = _cli(tmp_path, "report", "capacity", *window, "--by", "host,gpu", "--format", "json")
    assert report.exit_code == 0, report.output
    focus = _cli(tmp_path, "report", "capacity", *window, "--format", "focus")
    assert focus.exit_code == 0, focus.output
    figures = json.loads(report.output)
    assert sorted(g["gpu"] for g in figures["groups"]) == sorted(GPUS + GPUS2)
    assert all(g["busy_attributed_gpu_h"] > 0 for g in figures["groups"])
    assert len(focus.output.splitlines()) > 2
    return figures, focus.output


def _verify(pg_url: str, tmp_path: Path, *extra: str) -> None:
    ok = _cli(tmp_path, "audit", "verify", "--db", pg_url, *extra)
    assert ok.exit_code == 0 and "TAMPERED" not in ok.output, ok.output


def _trail(led: Ledger, action: str) -> list[dict[str, Any]]:
    q = "SELECT payload FROM audit_log WHERE action = %(a)s ORDER BY seq"
    return [json.loads(p) for p in led.read(lambda c: list(c.exec_driver_sql(q, {"a": action}).scalars()))]


def _exists(led: Ledger, name: str) -> bool:
    return led.read(lambda c: c.execute(sa.text("SELECT to_regclass(:n) IS NOT NULL"), {"n": name}).scalar())


def _starts(led: Ledger) -> list[tuple[str, int]]:
    return sorted((r["gpu_uuid"], r["t0_ms"]) for r in led.read(lambda c: intervals(c)))


def test_retention_drops_old_capacity_days_as_partitions_and_the_reports_stay_the_same(
    pg_url: str, tmp_path: Path, statements: list[str]
) -> None:
    parts = _populate(pg_url)
    before = _reports(pg_url, tmp_path)
    _verify(pg_url, tmp_path)
    with Ledger(pg_url) as led:  # every push landed in its day's partition
        assert led.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM gpu_capacity_default").scalar()) == 0
    statements.clear()

    out = _cli(tmp_path, "retention", "run", "--db", pg_url, "--keep-logs", "--capacity-days", "1")
    assert out.exit_code == 0, out.output
    old = [tiers._date(TODAY - 4), tiers._date(TODAY - 3)]
    empty = tiers._date(TODAY - 2)  # made ahead, nothing pushed into it: it goes too, with no trail entry
    assert f"capacity days dropped as partitions: {', '.join(old)}, {empty}\n" in out.output, out.output
    n_old = len(parts["old1"]) + len(parts["old2"])
    assert f"capacity: {n_old} raw intervals before {tiers._date(TODAY - 1)} deleted (day sums kept)" in out.output

    dropped = [s for s in statements if s.startswith("DROP TABLE gpu_capacity_p")]
    assert dropped == [
        f"DROP TABLE {partitions.day_name('gpu_capacity', d)}" for d in (TODAY - 4, TODAY - 3, TODAY - 2)
    ]
    assert [s for s in statements if DELETE_CAPACITY.search(s)] == []  # no row deleted, no bloat left
    with Ledger(pg_url) as led:
        assert not _exists(led, partitions.day_name("gpu_capacity", TODAY - 3))
        assert _exists(led, partitions.day_name("gpu_capacity", TODAY - 1))
        assert _starts(led) == sorted((r[0], r[2]) for r in parts["recent"])  # only the raw window is left
        trail = _trail(led, capacity_days_drop.ACTION)
    half = len(parts["old1"]) // 2  # node-1's rows each side of the midnight
    assert [(e["day"], e["hosts"]) for e in trail] == [
        (old[0], {HOST: half}), (old[1], {HOST: half, HOST2: len(parts["old2"])}),
    ]  # fmt: skip
    assert _reports(pg_url, tmp_path) == before  # the reports read the day sums, kept whole
    _verify(pg_url, tmp_path)

    again = _cli(tmp_path, "retention", "run", "--db", pg_url, "--keep-logs", "--capacity-days", "1")
    assert again.exit_code == 0 and "dropped as partitions" not in again.output, again.output


def _plant(url: str, wire: list[list[Any]]) -> None:
    """The series store already holds node-2's first interval with other figures (by its key, so a
    copy of the ledger's row is not stored over it): node-2's rows of that day do not check out."""
    names = ("gpu_uuid", "host", "t0_ms", "t1_ms", *capacity.STATES[:4], "unmeasured_ms", "energy_j")
    row = dict(zip(names, wire[0], strict=True))
    row["unallocated_ms"], row["alloc_idle_ms"], row["busy_attr_ms"], row["busy_unattr_ms"] = 10_000, 0, 0, 0
    store = series_tier.open_store(url)
    try:
        assert store.write_capacity([row], token="planted") == 1
    finally:
        store.close()


def test_a_day_one_host_of_which_the_store_does_not_hold_exactly_is_kept_whole(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    parts = _populate(pg_url)
    before = _reports(pg_url, tmp_path)
    _plant(series_url, parts["old2"])
    args = ["retention", "run", "--db", pg_url, "--keep-logs", "--capacity-days", "1", "--series", series_url]
    out = _cli(tmp_path, *args)
    assert out.exit_code == 1, out.output
    kept = tiers._date(TODAY - 3)
    assert f"KEPT capacity of host {HOST2}: the series store does not hold it exactly: {kept}" in out.output
    assert f"capacity days dropped as partitions: {tiers._date(TODAY - 4)}, {tiers._date(TODAY - 2)}\n" in out.output
    with Ledger(pg_url) as led:
        assert _exists(led, partitions.day_name("gpu_capacity", TODAY - 3))
        in_kept_day = [(r[0], r[2]) for r in parts["old1"] + parts["old2"] if r[2] >= MIDNIGHT_MS]
        assert _starts(led) == sorted(in_kept_day + [(r[0], r[2]) for r in parts["recent"]])  # node-1's too
        tiered = [(e["host"], e["day"]) for e in _trail(led, capacity_tier.ACTION)]
        dropped = [e["day"] for e in _trail(led, capacity_days_drop.ACTION)]
    assert tiered == [(HOST, tiers._date(TODAY - 4))]  # node-1's copy of the kept day was rolled back with it
    assert dropped == [tiers._date(TODAY - 4)]
    assert _reports(pg_url, tmp_path) == before
    _verify(pg_url, tmp_path, "--series", series_url)


def _plain_capacity(url: str) -> None:
    """Turn a migrated ledger's gpu_capacity back into the layout before migration 21: the table as
    schema.py defines it (created by SQLAlchemy, not by the code under test), the rows copied."""
    db = Database(url)
    table = schema.gpu_capacity.to_metadata(sa.MetaData())

    def tx(conn: sa.Connection) -> None:
        x = conn.exec_driver_sql
        x("ALTER TABLE gpu_capacity RENAME TO gpu_capacity_part")
        x("ALTER TABLE gpu_capacity_part RENAME CONSTRAINT gpu_capacity_pkey TO x_gpu_capacity")
        x("ALTER INDEX ix_gpu_capacity_host_t0 RENAME TO x_ix_gpu_capacity")
        table.create(conn)
        cols = ", ".join(f'"{c.name}"' for c in table.columns)
        x(f"INSERT INTO gpu_capacity ({cols}) SELECT {cols} FROM gpu_capacity_part")
        x("DROP TABLE gpu_capacity_part")
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 21))

    try:
        db.write(tx)
    finally:
        db.close()


def test_migration_21_partitions_a_populated_capacity_table_keeping_every_row(pg_url: str, tmp_path: Path) -> None:
    parts = _populate(pg_url)
    before = _reports(pg_url, tmp_path)
    _plain_capacity(pg_url)

    def rows(db: Database | Ledger) -> list[Any]:
        return sorted(tuple(r) for r in db.read(lambda c: list(c.execute(sa.select(schema.gpu_capacity)))))

    old = Database(pg_url)
    try:
        plain = rows(old)
        assert len(plain) == sum(len(p) for p in parts.values())
        assert not old.read(lambda c: partitions.is_partitioned(c, "gpu_capacity"))
        assert old.read(migrations.current_version) == 20
        assert migrations.upgrade(old) == migrations.LATEST
    finally:
        old.close()
    with Ledger(pg_url) as led:
        assert rows(led) == plain
        assert led.read(lambda c: partitions.is_partitioned(c, "gpu_capacity"))
        days = set(led.read(lambda c: partitions.day_partitions(c, "gpu_capacity")))
        assert days == {TODAY - 4, TODAY - 3, TODAY - 1}
        assert led.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM gpu_capacity_default").scalar()) == 0
        index = "SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_gpu_capacity_host_t0'"
        assert "(host, t0_ms)" in led.read(lambda c: c.exec_driver_sql(index).scalar())
        verified = audit.verify(led, close_after_days=OPEN_DAYS)
        assert verified.ok, verified.problems
    assert _reports(pg_url, tmp_path) == before
    # The key holds across the partitions: every interval written again stores nothing.
    ivs = [CapacityInterval(r[0], r[1], r[2], r[3], States(*r[4:8]), r[8], r[9]) for p in parts.values() for r in p]
    with Ledger(pg_url) as led:
        assert led.write(lambda c: write_capacity(led.database, c, ivs, [])) == 0


def test_a_day_whose_day_sums_miss_an_interval_is_kept(pg_url: str, tmp_path: Path) -> None:
    """An interval written behind the ledger's back (SQL, not write_capacity) is in no day sum: its
    day stays, so the interval is not lost to the reports for good, and the report says why."""
    _populate(pg_url)
    t0 = MIDNIGHT_MS - DAY_MS + 3_600_000  # four days ago, 01:00: a day only node-1 wrote
    with Ledger(pg_url) as led:
        led.write(lambda c: c.exec_driver_sql(
            "INSERT INTO gpu_capacity (gpu_uuid, t0_ms, t1_ms, host, unallocated_ms, alloc_idle_ms, busy_attr_ms, "
            f"busy_unattr_ms, unmeasured_ms) VALUES ('{GPUS[0]}', {t0}, {t0 + 10_000}, '{HOST}', 10000, 0, 0, 0, 0)"
        ))  # fmt: skip
    out = _cli(tmp_path, "retention", "run", "--db", pg_url, "--keep-logs", "--capacity-days", "1")
    assert out.exit_code == 0, out.output
    kept = f"kept capacity of {tiers._date(TODAY - 4)}: the day sums (gpu_capacity_days) of GPU {GPUS[0]}"
    assert kept in out.output, out.output
    with Ledger(pg_url) as led:
        assert _exists(led, partitions.day_name("gpu_capacity", TODAY - 4))
        assert not _exists(led, partitions.day_name("gpu_capacity", TODAY - 3))
        assert (GPUS[0], t0) in _starts(led)


def test_a_capacity_push_ten_days_late_makes_its_days_first_and_deletes_nothing(
    pg_url: str, statements: list[str]
) -> None:
    """An agent's outbox sent ten days late: its days get their partitions before the rows go in,
    the default partition stays empty, and the hourly pass after has nothing to move."""
    setup_accounts(pg_url)
    token = enroll(pg_url, HOST)
    shift = (TODAY - 10) * DAY_MS - MIDNIGHT_MS  # across the midnight ten days ago
    rows = [[r[0], r[1], r[2] + shift, r[3] + shift, *r[4:]] for r in _wire()]
    with TestClient(create_app(pg_url, settings=Settings(close_after_days=OPEN_DAYS))) as client, Ledger(pg_url) as led:
        assert not _exists(led, partitions.day_name("gpu_capacity", TODAY - 11))
        statements.clear()
        first, last = rows[0][2] / 1000 - 600, rows[-1][3] / 1000
        seen = [{"uuid": g, "name": "NVIDIA L4", "host": HOST, "first_seen": first, "last_seen": last} for g in GPUS]
        got = client.post("/api/v1/capacity", json={"intervals": rows, "gpus": seen}, headers=bearer(token))
        assert got.status_code == 200 and got.json()["stored"] == len(rows), got.text
        made = [s for s in statements if s.startswith("CREATE TABLE gpu_capacity_p")]
        assert made == [
            f"CREATE TABLE {partitions.day_name('gpu_capacity', d)} (LIKE gpu_capacity INCLUDING DEFAULTS)"
            for d in (TODAY - 11, TODAY - 10)
        ]
        where = "SELECT tableoid::regclass::text, count(*) FROM gpu_capacity GROUP BY 1"
        assert dict(led.read(lambda c: c.exec_driver_sql(where).all())) == {  # type: ignore[arg-type]
            partitions.day_name("gpu_capacity", TODAY - 11): len([r for r in rows if r[2] < (TODAY - 10) * DAY_MS]),
            partitions.day_name("gpu_capacity", TODAY - 10): len([r for r in rows if r[2] >= (TODAY - 10) * DAY_MS]),
        }
        assert partitions.maintain(led.database).moved == 0
        assert led.read(lambda c: c.exec_driver_sql("SELECT count(*) FROM gpu_capacity_default").scalar()) == 0
        assert [s for s in statements if DELETE_CAPACITY.search(s)] == []
