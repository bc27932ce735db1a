"""Versioned schema: the ordered list of migrations and the code that applies them.

``schema_version`` holds one row per applied version; the database's version is the highest.
Migration 1 creates the whole *current* schema (schema.py) and only ever runs on an empty database,
which is then stamped with every version up to LATEST (alembic's "create_all, then stamp head").
Each later migration must therefore be written against the previous shape with explicit DDL
(``ALTER TABLE ...``), never by reading schema.py.

Applying is safe when several processes open the same fresh database at once: the version is read
and the migrations run inside one write transaction that holds the database's write lock (SQLite:
BEGIN IMMEDIATE) or a transaction-scoped advisory lock (PostgreSQL). Both backends have
transactional DDL, so a failed migration leaves the previous version intact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection

from gpuledger.store import partitions, schema
from gpuledger.store.engine import Database, denied_message
from gpuledger.store.errors import LedgerDenied, LedgerError, SchemaOutdated, SchemaTooNew
from gpuledger.store.url import display_url
from gpuledger.store.version import LATEST as STATED_LATEST

MIGRATE_COMMAND = "gpuledger db migrate"
# First key of the two-int advisory lock; the second is a hash of the schema (one lock per ledger).
_PG_LOCK_KEY = 0x67707500


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[Connection], None]


def _create_all(conn: Connection) -> None:
    schema.metadata.create_all(conn)
    partitions.partition_tables(conn)  # PostgreSQL: the raw tables by day, as migration 18 makes them
    partitions.partition_capacity(conn)  # and the capacity intervals, as migration 21 does


def _add_gpu_rollups(conn: Connection) -> None:
    # Written out, not taken from schema.py: this is the table as version 2 created it.
    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    table = sa.Table(
        "gpu_rollups",
        frozen,
        sa.Column("run_id", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("gpu_name", sa.Text, primary_key=True),
        sa.Column("mig_profile", sa.String, primary_key=True),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("t0", sa.Double, nullable=False),
        sa.Column("t1", sa.Double, nullable=False),
        sa.Column("alloc_s", sa.Double, nullable=False),
        sa.Column("busy_s", sa.Double),
        sa.Column("energy_j", sa.Double),
        sa.Column("intervals", sa.Integer, nullable=False),
        sa.Column("share_rule", sa.String),
        sa.Index("ix_gpu_rollups_day", "day"),
    )
    table.create(conn)


def _add_label_index(conn: Connection) -> None:
    # A covering index: cost reports read the instance_type label of every run from it alone.
    # Skipped when there: a ledger rebuilt to an older version by hand may still carry it.
    if "ix_run_labels_key_run_value" in {ix["name"] for ix in sa.inspect(conn).get_indexes("run_labels")}:
        return
    frozen = sa.MetaData()
    labels = sa.Table(
        "run_labels",
        frozen,
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    sa.Index("ix_run_labels_key_run_value", labels.c.key, labels.c.run_id, labels.c.value).create(conn)


def _add_team_tables(conn: Connection) -> None:
    # schema_team.define is the shape as version 3 created it (see its docstring).
    from gpuledger.store import schema_team

    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    json_type = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")
    tables = schema_team.define(frozen, json_type)
    for name in schema_team.NAMES:
        tables[name].create(conn)


def _add_rollup_state(conn: Connection) -> None:
    # Version 4's shapes, written out: runs gains rolled_up, gpu_rollups the run's grouping values.
    frozen = sa.MetaData()
    runs = sa.Table(
        "runs",
        frozen,
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("status", sa.String),
        sa.Column("started_at", sa.Double),
        sa.Column("ended_at", sa.Double),
        sa.Column("user", sa.Text),
        sa.Column("team", sa.Text),
        sa.Column("project", sa.Text),
        sa.Column("attempt_of", sa.String),
        sa.Column("name", sa.Text),
        sa.Column("rolled_up", sa.Boolean),
    )
    labels = sa.Table(
        "run_labels", frozen, sa.Column("run_id", sa.String), sa.Column("key", sa.Text), sa.Column("value", sa.Text)
    )
    devices = sa.Table("devices", frozen, sa.Column("run_id", sa.String))
    rollups = sa.Table(
        "gpu_rollups",
        frozen,
        sa.Column("run_id", sa.String),
        *(sa.Column(name, sa.Text) for name in ("team", "project", "user", "instance_type")),
    )
    # Each piece is skipped when there: a ledger rebuilt to an older version by hand may hold it.
    inspector = sa.inspect(conn)
    run_columns = {c["name"] for c in inspector.get_columns("runs")}
    rollup_columns = {c["name"] for c in inspector.get_columns("gpu_rollups")}
    run_indexes = {ix["name"] for ix in inspector.get_indexes("runs")}
    if "rolled_up" not in run_columns:
        conn.execute(sa.text("ALTER TABLE runs ADD COLUMN rolled_up BOOLEAN NOT NULL DEFAULT false"))
    for name in ("team", "project", "user", "instance_type"):
        if name not in rollup_columns:
            conn.execute(sa.text(f'ALTER TABLE gpu_rollups ADD COLUMN "{name}" TEXT'))
    if "ix_runs_rolled_up_started_at" not in run_indexes:
        sa.Index("ix_runs_rolled_up_started_at", runs.c.rolled_up, runs.c.started_at).create(conn)
    window = ("started_at", "ended_at", "id", "status", "user", "team", "project", "attempt_of", "name")
    if "ix_runs_cost_window" not in run_indexes:
        sa.Index("ix_runs_cost_window", *(runs.c[c] for c in window)).create(conn)
    # Rolled up: finished runs that have rollup rows, or no GPU at all (nothing to roll up).
    has_rows = sa.exists().where(rollups.c.run_id == runs.c.id)
    has_gpu = sa.exists().where(devices.c.run_id == runs.c.id)
    conn.execute(sa.update(runs).where(runs.c.status != "running", sa.or_(has_rows, ~has_gpu)).values(rolled_up=True))
    run_of = runs.c.id == rollups.c.run_id
    instance_of = sa.and_(labels.c.run_id == rollups.c.run_id, labels.c.key == "instance_type")
    if conn.dialect.name == "postgresql":  # UPDATE ... FROM: a join, minutes faster than subqueries
        copies = {"team": runs.c.team, "project": runs.c.project, "user": runs.c.user}
        conn.execute(sa.update(rollups).where(run_of).values(copies))
        conn.execute(sa.update(rollups).where(instance_of).values(instance_type=labels.c.value))
        return
    conn.execute(
        sa.update(rollups).values(
            team=sa.select(runs.c.team).where(run_of).scalar_subquery(),
            project=sa.select(runs.c.project).where(run_of).scalar_subquery(),
            user=sa.select(runs.c.user).where(run_of).scalar_subquery(),
            instance_type=sa.select(labels.c.value).where(instance_of).scalar_subquery(),
        )
    )


def _add_coverage_columns(conn: Connection) -> None:
    # How each GPU interval's busy time was covered, and how the run's processes were found.
    existing = {c["name"] for c in sa.inspect(conn).get_columns("gpu_intervals")}
    kind = "DOUBLE PRECISION" if conn.dialect.name == "postgresql" else "REAL"
    for name, sql_type in (("util_idle_s", kind), ("util_unknown_s", kind), ("proc_method", "VARCHAR")):
        if name not in existing:
            conn.execute(sa.text(f"ALTER TABLE gpu_intervals ADD COLUMN {name} {sql_type}"))


def _add_unmeasured_column(conn: Connection) -> None:
    # Version 12: each GPU interval's exact unmeasured time. Rows stored before it stay NULL and
    # are judged by the per-interval rule (store/queries.unmeasured_sql): no rewrite of a big table.
    if "util_unmeasured_s" in {c["name"] for c in sa.inspect(conn).get_columns("gpu_intervals")}:
        return
    kind = "DOUBLE PRECISION" if conn.dialect.name == "postgresql" else "REAL"
    conn.execute(sa.text(f"ALTER TABLE gpu_intervals ADD COLUMN util_unmeasured_s {kind}"))


def _add_ownership(conn: Connection) -> None:
    # Version 7: signatures on audit rows, run_owners and gpu_owners (schema_audit.define is the
    # shape as version 7 created it). Each piece is skipped when there (a ledger rebuilt by hand).
    from gpuledger.store import schema_audit

    inspector = sa.inspect(conn)
    audit_columns = {c["name"] for c in inspector.get_columns("audit_log")}
    for name, sql_type in (("key_id", "VARCHAR(16)"), ("sig", "TEXT")):
        if name not in audit_columns:
            conn.execute(sa.text(f"ALTER TABLE audit_log ADD COLUMN {name} {sql_type}"))
    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    tables = schema_audit.define(frozen)
    existing = set(inspector.get_table_names())
    for name in schema_audit.NAMES:
        if name not in existing:
            tables[name].create(conn)
    # Each GPU (and MIG parent) already stored belongs to the host of the latest run that used it,
    # for any agent of that host: the cost code's shared-GPU split then counts only that host's runs.
    conn.execute(
        sa.text(
            "INSERT INTO gpu_owners (uuid, host, user_name, since, source) "
            "SELECT uuid, host, NULL, :now, 'migration' FROM ("
            "  SELECT g.uuid AS uuid, r.host AS host, "
            "         ROW_NUMBER() OVER (PARTITION BY g.uuid ORDER BY r.started_at DESC, r.id DESC) AS n"
            "  FROM (SELECT uuid, run_id FROM devices"
            "        UNION SELECT mig_parent_uuid, run_id FROM devices WHERE mig_parent_uuid IS NOT NULL) g"
            "  JOIN runs r ON r.id = g.run_id) latest "
            "WHERE n = 1 AND uuid NOT IN (SELECT uuid FROM gpu_owners)"
        ),
        {"now": time.time()},
    )


def _add_ingest_tables(conn: Connection) -> None:
    # schema_ingest.define is the shape as version 8 created it (see its docstring). Each table is
    # skipped when there: a ledger rebuilt to an older version by hand may hold it.
    from gpuledger.store import schema_ingest

    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    tables = schema_ingest.define(frozen)
    existing = set(sa.inspect(conn).get_table_names())
    for name in schema_ingest.NAMES:
        if name not in existing:
            tables[name].create(conn)


def _add_capacity_tables(conn: Connection) -> None:
    # schema_capacity.define is the shape as version 9 created it (see its docstring). Each table
    # is skipped when there: a ledger rebuilt to an older version by hand may hold it.
    from gpuledger.store import schema_capacity

    tables = schema_capacity.define(sa.MetaData())
    existing = set(sa.inspect(conn).get_table_names())
    for name in schema_capacity.NAMES:
        if name not in existing:
            tables[name].create(conn)


def _key_rollups_by_measured(conn: Connection) -> None:
    # Version 10: gpu_rollups gains ``measured`` (busy_s is not NULL) in its primary key, so a GPU
    # billed its held hours by rule never shares a row with a measured GPU of the same model. Rows
    # already written keep their values: a row that mixed both is rewritten by a rebuild of the
    # rollups (``gpuledger report rollup --rebuild``). Skipped when there (a ledger rebuilt by hand).
    inspector = sa.inspect(conn)
    if "measured" in {c["name"] for c in inspector.get_columns("gpu_rollups")}:
        return
    key = ("run_id", "day", "gpu_name", "mig_profile", "measured")
    if conn.dialect.name == "postgresql":
        pk = inspector.get_pk_constraint("gpu_rollups").get("name") or "gpu_rollups_pkey"
        conn.execute(sa.text("ALTER TABLE gpu_rollups ADD COLUMN measured BOOLEAN NOT NULL DEFAULT true"))
        conn.execute(sa.text("ALTER TABLE gpu_rollups ALTER COLUMN measured DROP DEFAULT"))
        conn.execute(sa.text("UPDATE gpu_rollups SET measured = false WHERE busy_s IS NULL"))
        conn.execute(sa.text(f'ALTER TABLE gpu_rollups DROP CONSTRAINT "{pk}", ADD PRIMARY KEY ({", ".join(key)})'))
        return
    # SQLite cannot change a primary key in place: a new table, the rows copied, then renamed
    # (the procedure of SQLite's ALTER TABLE documentation). The table as version 10 made it:
    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    grouping = ("team", "project", "user", "instance_type")
    values = ("gpus", "t0", "t1", "alloc_s", "busy_s", "energy_j", "intervals", "share_rule", *grouping)
    types = {"gpus": sa.Integer, "intervals": sa.Integer, "share_rule": sa.String, **dict.fromkeys(grouping, sa.Text)}
    not_null = {"gpus", "t0", "t1", "alloc_s", "intervals"}
    new = sa.Table(
        "gpu_rollups_v10",
        frozen,
        sa.Column("run_id", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("gpu_name", sa.Text, primary_key=True),
        sa.Column("mig_profile", sa.String, primary_key=True),
        *(sa.Column(name, types.get(name, sa.Double), nullable=name not in not_null) for name in values),
        sa.Column("measured", sa.Boolean, primary_key=True, autoincrement=False),
    )
    new.create(conn)
    copied = ", ".join(f'"{c}"' for c in ("run_id", "day", "gpu_name", "mig_profile", *values))
    copy = f"INSERT INTO gpu_rollups_v10 ({copied}, measured) SELECT {copied}, busy_s IS NOT NULL FROM gpu_rollups"
    conn.execute(sa.text(copy))
    conn.execute(sa.text("DROP TABLE gpu_rollups"))
    conn.execute(sa.text("ALTER TABLE gpu_rollups_v10 RENAME TO gpu_rollups"))
    conn.execute(sa.text("CREATE INDEX ix_gpu_rollups_day ON gpu_rollups (day)"))


def _add_stay_instance_types(conn: Connection) -> None:
    # Version 11: gpu_fleet_hosts.instance_type, what each host's agent named. Stays already stored
    # get the GPU's instance type (how version 10 priced them). Skipped when there.
    if "instance_type" in {c["name"] for c in sa.inspect(conn).get_columns("gpu_fleet_hosts")}:
        return
    conn.execute(sa.text("ALTER TABLE gpu_fleet_hosts ADD COLUMN instance_type TEXT"))
    conn.execute(
        sa.text(
            "UPDATE gpu_fleet_hosts SET instance_type = "
            "(SELECT f.instance_type FROM gpu_fleet f WHERE f.uuid = gpu_fleet_hosts.uuid)"
        )
    )


def _mark_compressed_logs(conn: Connection) -> None:
    # Version 13: logs.data may hold the log zlib-compressed (store/log_codec.py: shorter than
    # size_b). No table changes; the version keeps a gpuledger that would read those bytes as the
    # log itself (and call a sealed log changed) off this ledger. Stored logs stay as they are.
    return


def _add_token_hosts(conn: Connection) -> None:
    # Version 15: api_tokens.host, the machine an agent token is bound to (store/accounts.py).
    # Tokens issued before stay unbound: they push runs on GPUs already registered, nothing more.
    if "host" in {c["name"] for c in sa.inspect(conn).get_columns("api_tokens")}:
        return
    conn.execute(sa.text("ALTER TABLE api_tokens ADD COLUMN host TEXT"))


def _add_refusal_folds(conn: Connection) -> None:
    # Version 16: refusal_folds, per token the time of its last push.refused row and the refusals
    # folded since (store/refusal_trail.py). The table as schema_refusals.py defines it at 16.
    from gpuledger.store import schema_refusals

    schema_refusals.define(sa.MetaData()).create(conn, checkfirst=True)


def _add_run_lineage(conn: Connection) -> None:
    # Version 17: run_lineage (store/lineage.py), as schema_lineage.py defines it at 17, filled from
    # the runs that already carry meta.lineage or an evaluation's weights.
    from gpuledger.store import lineage, schema_lineage

    table = schema_lineage.define(sa.MetaData())
    table.create(conn, checkfirst=True)
    lineage.backfill(conn, table)


def _add_series_only(conn: Connection) -> None:
    # Version 19: the two tables as schema_series_only.py defines them at 19 (both empty).
    from gpuledger.store import schema_series_only

    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    for table in schema_series_only.define(frozen):
        table.create(conn, checkfirst=True)


def _add_series_streams(conn: Connection) -> None:
    # Version 20: series_streams as schema_series_streams.py defines it at 20. The streams of runs
    # already series-only get a row each, not complete: their rows so far are in the store only,
    # so their sums would miss them (n/a until `db migrate --series URL` recomputes them); gauges
    # come from a row later than any held (last_seq: the highest the segments hold).
    from gpuledger.store import schema_series_streams

    frozen = sa.MetaData()
    sa.Table("runs", frozen, sa.Column("id", sa.String, primary_key=True))
    seg = sa.Table(
        "series_segments",
        frozen,
        sa.Column("run_id", sa.String),
        sa.Column("device_uuid", sa.String),
        sa.Column("last_seq", sa.BigInteger),
    )
    table = schema_series_streams.define(frozen)
    table.create(conn, checkfirst=True)
    held = sa.select(seg.c.run_id, seg.c.device_uuid, sa.false(), sa.func.max(seg.c.last_seq)).group_by(
        seg.c.run_id, seg.c.device_uuid
    )
    if conn.scalar(sa.select(sa.func.count()).select_from(table)) == 0:
        conn.execute(sa.insert(table).from_select(["run_id", "device_uuid", "complete", "last_seq"], held))


def _add_swept_at(conn: Connection) -> None:
    # Version 14: runs.swept_at, the liveness sweep's verdict as a column only the server sets (it
    # was read from status_reason, text any push could copy). A run gets it once here when its
    # latest run.ended row is the sweep's own and it is not sealed (a sealed run keeps its seal).
    # Skipped when there (a ledger rebuilt by hand).
    if "swept_at" in {c["name"] for c in sa.inspect(conn).get_columns("runs")}:
        return
    conn.execute(sa.text("ALTER TABLE runs ADD COLUMN swept_at DOUBLE PRECISION"))
    ended = (
        "SELECT {col} FROM audit_log a WHERE a.object = 'run:' || runs.id AND a.action = 'run.ended' "
        "ORDER BY a.seq DESC LIMIT 1"
    )
    conn.execute(
        sa.text(
            f"UPDATE runs SET swept_at = ({ended.format(col='a.t')}) "
            "WHERE status = 'lost' AND status_reason LIKE :prefix "
            f"AND ({ended.format(col='a.actor')}) = :actor "
            "AND NOT EXISTS (SELECT 1 FROM audit_log s WHERE s.object = 'run:' || runs.id "
            "AND s.action IN ('run.sealed', 'run.resealed'))"
        ),
        {"prefix": "the server heard nothing of this run for%", "actor": "server (liveness sweep)"},
    )


def _add_audit_action_index(conn: Connection) -> None:
    # Version 22: audit_log by (action, t) (schema.py adds it to the current shape). The tier
    # store's window pass reads the tier entries written since its last window
    # (store/series_window.py); without the index that read was every entry of the action since
    # the ledger began, growing with the fleet's history. The build holds the table's write lock,
    # as any ``gpuledger db migrate`` may.
    conn.execute(sa.text("CREATE INDEX IF NOT EXISTS ix_audit_log_action_t ON audit_log (action, t)"))


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "create runs, labels, devices, intervals, events, metrics, logs", _create_all),
    Migration(2, "add gpu_rollups: per run, GPU model and day sums for cost reports", _add_gpu_rollups),
    Migration(3, "add team tables: users, projects, tokens, audit log, push state, rollup marks", _add_team_tables),
    Migration(4, "add ix_run_labels_key_run_value: a covering label index for cost reports", _add_label_index),
    Migration(
        5, "add runs.rolled_up, a covering index for cost reports, grouping values on gpu_rollups", _add_rollup_state
    ),
    Migration(
        6,
        "add gpu_intervals.util_idle_s, util_unknown_s, proc_method: how busy time was covered",
        _add_coverage_columns,
    ),
    Migration(7, "add audit_log.key_id and sig, run_owners, gpu_owners: signed history and ownership", _add_ownership),
    Migration(
        8, "add quarantined_rows, run_liveness and push_quarantine: partial acceptance of pushes", _add_ingest_tables
    ),
    Migration(
        9,
        "add gpu_capacity, gpu_capacity_days, gpu_fleet, gpu_fleet_hosts, capacity_pushes: the capacity ledger",
        _add_capacity_tables,
    ),
    Migration(
        10,
        "add gpu_rollups.measured to the key: GPUs with and without busy time get rows of their own",
        _key_rollups_by_measured,
    ),
    Migration(
        11, "add gpu_fleet_hosts.instance_type: a GPU is priced as each host it was on had it", _add_stay_instance_types
    ),
    Migration(
        12,
        "add gpu_intervals.util_unmeasured_s: the exact time no sample or instant reading measured",
        _add_unmeasured_column,
    ),
    Migration(
        13, "store logs zlib-compressed when that is shorter (logs.data shorter than size_b)", _mark_compressed_logs
    ),
    Migration(14, "add runs.swept_at: the liveness sweep's verdict, set by the server only", _add_swept_at),
    Migration(15, "add api_tokens.host: agent tokens bound to the host they report for", _add_token_hosts),
    Migration(16, "add refusal_folds: at most one push.refused audit row per token per minute", _add_refusal_folds),
    Migration(17, "add run_lineage: model line, weights and parent run per run, indexed", _add_run_lineage),
    Migration(
        18,
        "PostgreSQL: gpu_intervals and host_intervals partitioned by UTC day of t0 (rewrites them once)",
        partitions.partition_tables,
    ),
    Migration(
        19,
        "add series_only_runs, series_segments, series_day_sums: runs whose raw intervals only the series store holds",
        _add_series_only,
    ),
    Migration(
        20,
        "add series_streams: a series-only run's host CPU, throttle time and last-row gauges for /metrics",
        _add_series_streams,
    ),
    Migration(
        21,
        "PostgreSQL: gpu_capacity partitioned by UTC day of t0_ms (rewrites it once)",
        partitions.partition_capacity,
    ),
    Migration(22, "add ix_audit_log_action_t: the audit entries of one action since a time", _add_audit_action_index),
)
LATEST = MIGRATIONS[-1].version
if LATEST != STATED_LATEST:  # gpuledger run reads that number without loading this module
    raise ImportError(f"store/version.py says schema version {STATED_LATEST}, the last migration is {LATEST}")


def current_version(conn: Connection) -> int:
    """The database's schema version, 0 for an empty database."""
    if not sa.inspect(conn).has_table(schema.schema_version.name):
        if conn.dialect.name == "postgresql" and conn.scalar(sa.text("SELECT current_schema()")) is None:
            # not an empty ledger: its schema is missing or hidden from this user ("run db migrate" would not help)
            where = display_url(conn.engine.url)
            raise LedgerDenied(denied_message(where, "no schema of the search_path exists or may be used"))
        return 0
    return conn.scalar(sa.select(sa.func.max(schema.schema_version.c.version))) or 0


def check(db: Database, version: int, latest: int = LATEST, *, migrate: bool = True) -> None:
    """Raise if a database at ``version`` cannot be used by this code (as is, or after migrating)."""
    if version > latest:
        raise SchemaTooNew(
            f"the ledger {db.display} has schema version {version}, newer than this gpuledger knows "
            f"({latest}): it was written by a newer gpuledger; upgrade gpuledger "
            "(pip install -U gpuledger) or use another ledger"
        )
    if version < latest and not migrate:
        raise SchemaOutdated(
            f"the ledger {db.display} has schema version {version} but this gpuledger needs {latest}; "
            f"run `{MIGRATE_COMMAND} --db URL` once (the server and admin commands never migrate a "
            "shared ledger by themselves), then start again"
        )


def upgrade(db: Database, migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """Apply the pending migrations; return the version the database is at afterwards."""
    latest = migrations[-1].version

    def run(conn: Connection) -> int:
        if db.dialect == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(:key, hashtext(coalesce(current_schema(), '')))"),
                {"key": _PG_LOCK_KEY},
            )
        # Read the version only now, under the lock: another process may just have migrated.
        version = current_version(conn)
        check(db, version, latest)
        if version == latest:
            return version
        now = time.time()
        if version == 0:
            if sa.inspect(conn).has_table(schema.runs.name):
                raise LedgerError(
                    f"{db.display} has a 'runs' table but no gpuledger schema_version: it is not a "
                    "gpuledger ledger; point GPULEDGER_DB / --db at a new or existing ledger"
                )
            migrations[0].apply(conn)
            stamped = [{"version": m.version, "applied_at": now, "description": m.description} for m in migrations]
        else:
            stamped = []
            for m in migrations:
                if m.version > version:
                    m.apply(conn)
                    stamped.append({"version": m.version, "applied_at": now, "description": m.description})
        conn.execute(sa.insert(schema.schema_version), stamped)
        return latest

    return db.write(run)
