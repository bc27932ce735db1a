"""The ledger's tables (SQLAlchemy Core), the *current* shape of the schema.

Column names equal the field names of the dataclasses in ``core/model.py`` so rows map to records
without a translation table. Byte counts are BigInteger; seconds, joules and other measurements are
double precision. A change here needs a new migration in ``migrations.py``.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

from gpuledger.store import (
    schema_audit,
    schema_capacity,
    schema_ingest,
    schema_lineage,
    schema_refusals,
    schema_series_only,
    schema_series_streams,
    schema_team,
)

metadata = sa.MetaData()

# JSON, with SQL NULL for Python None ("absent is not zero"); jsonb on PostgreSQL.
Json = sa.JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class Measured(TypeDecorator[float]):
    """An optional measurement: a NaN reading is no reading, so it is stored as NULL."""

    impl = sa.Double
    cache_ok = True

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        # One function per value, not TypeDecorator's process_bind_param and the impl's: every
        # interval row binds a dozen of these.
        impl = self._unwrapped_dialect_impl(dialect).bind_processor(dialect)
        if dialect.name == "sqlite" and impl is None:
            return None  # SQLite itself stores a bound NaN as NULL: nothing to do per value
        isnan, real = math.isnan, float

        def process(value: Any) -> Any:
            if isinstance(value, real) and isnan(value):
                return None
            return value if impl is None or value is None else impl(value)

        return process


class MetricValue(TypeDecorator[float]):
    """A training metric value, NaN kept (a NaN loss is a result, not a missing value).

    SQLite turns a bound NaN into NULL, so on SQLite NaN is stored as the text 'NaN'
    (a REAL-affinity column keeps non-numeric text as is) and read back as float('nan').
    """

    impl = sa.Double
    cache_ok = True

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        # Replaces (not wraps) the impl's processor, whose float() would turn "NaN" back into nan.
        def process(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return "NaN"
            return value

        return process

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        return float(value) if isinstance(value, str) else value


def _run_fk() -> sa.ForeignKey:
    return sa.ForeignKey("runs.id", ondelete="CASCADE")


schema_version = sa.Table(
    "schema_version",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("applied_at", sa.Double, nullable=False),
    sa.Column("description", sa.Text, nullable=False),
)

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("attempt_of", sa.String),
    sa.Column("name", sa.Text),
    sa.Column("status", sa.String, nullable=False),
    sa.Column("command", Json, nullable=False),
    sa.Column("cwd", sa.Text, nullable=False),
    sa.Column("user", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("ended_at", sa.Double),
    sa.Column("exit_code", sa.Integer),
    sa.Column("signal", sa.Integer),
    sa.Column("labels", Json, nullable=False),
    sa.Column("git", Json, nullable=False),
    sa.Column("versions", Json, nullable=False),
    sa.Column("meta", Json, nullable=False),  # hyper-parameters, model, dataset ... from integrations
    sa.Column("replayed", sa.Boolean, nullable=False),
    sa.Column("interval_s", sa.Double, nullable=False),
    sa.Column("recorder_pid", sa.Integer),
    sa.Column("log_path", sa.Text),
    sa.Column("status_reason", sa.Text),
    sa.Column("gpu_note", sa.Text),
    # Copies of labels["project"] / labels["team"]: the two filters every report uses.
    sa.Column("project", sa.Text),
    sa.Column("team", sa.Text),
    # True once the run's GPU use is in gpu_rollups (or it had no GPU): reports then read those rows
    # instead of its intervals. Cleared when anything the rollup depends on changes (migration 5).
    sa.Column("rolled_up", sa.Boolean, nullable=False, default=False, server_default=sa.false()),
    # When the liveness sweep (store/liveness_sweep.py) marked the run lost; only the server sets it,
    # never a push. NULL for every run its own agent ended (migration 14).
    sa.Column("swept_at", sa.Double),
    sa.Index("ix_runs_started_at", "started_at"),
    sa.Index("ix_runs_project_started_at", "project", "started_at"),
    sa.Index("ix_runs_team_started_at", "team", "started_at"),
    sa.Index("ix_runs_user_started_at", "user", "started_at"),
    sa.Index("ix_runs_status", "status"),
    sa.Index("ix_runs_attempt_of", "attempt_of"),
    sa.Index("ix_runs_rolled_up_started_at", "rolled_up", "started_at"),  # the few runs not rolled up
    # Covers what a cost report reads of every run in its window, so it never reads the wide rows
    # (JSON columns) of half a million runs (migration 5).
    sa.Index(
        "ix_runs_cost_window",
        "started_at",
        "ended_at",
        "id",
        "status",
        "user",
        "team",
        "project",
        "attempt_of",
        "name",
    ),
)

# One row per label, so any label can be filtered on with an index.
run_labels = sa.Table(
    "run_labels",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Index("ix_run_labels_key_value", "key", "value"),
    # Covering: a cost report reads one label of every run in its window from the index alone.
    sa.Index("ix_run_labels_key_run_value", "key", "run_id", "value"),  # migration 4
)

devices = sa.Table(
    "devices",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("uuid", sa.String, primary_key=True),
    sa.Column("index", sa.Integer, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("pci_bus_id", sa.String),
    sa.Column("memory_total_b", sa.BigInteger),
    sa.Column("power_limit_w", Measured),
    sa.Column("driver_version", sa.String),
    sa.Column("cuda_version", sa.String),
    sa.Column("mig_mode", sa.String),
    sa.Column("mig_parent_uuid", sa.String),
    sa.Column("mig_profile", sa.String),
    sa.Column("nvml_index", sa.Integer),
    sa.Column("source", sa.String, nullable=False),
    sa.Index("ix_devices_uuid", "uuid"),  # "who used this GPU"
)

gpu_intervals = sa.Table(
    "gpu_intervals",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("device_uuid", sa.String, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("t0", sa.Double, nullable=False),
    sa.Column("t1", sa.Double, nullable=False),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("busy_s", Measured),
    sa.Column("util_method", sa.String),
    sa.Column("util_max_pct", Measured),
    sa.Column("util_idle_s", Measured),
    sa.Column("util_unknown_s", Measured),
    sa.Column("util_unmeasured_s", Measured),  # migration 12
    sa.Column("energy_j", Measured),
    sa.Column("energy_method", sa.String),
    sa.Column("power_max_w", Measured),
    sa.Column("mem_used_max_b", sa.BigInteger),
    sa.Column("mem_used_last_b", sa.BigInteger),
    sa.Column("mem_reserved_b", sa.BigInteger),
    sa.Column("proc_mem_max_b", sa.BigInteger),
    sa.Column("proc_sm_util_avg_pct", Measured),
    sa.Column("proc_method", sa.String),
    sa.Column("temp_max_c", Measured),
    sa.Column("sm_clock_avg_mhz", Measured),
    sa.Column("mem_clock_max_mhz", Measured),
    sa.Column("throttle_s", Json),
)

host_intervals = sa.Table(
    "host_intervals",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("t0", sa.Double, nullable=False),
    sa.Column("t1", sa.Double, nullable=False),
    sa.Column("samples", sa.Integer, nullable=False),
    sa.Column("cpu_s", sa.Double, nullable=False),
    sa.Column("rss_max_b", sa.BigInteger, nullable=False),
    sa.Column("read_b", sa.BigInteger, nullable=False),
    sa.Column("write_b", sa.BigInteger, nullable=False),
    sa.Column("threads_max", sa.Integer, nullable=False),
    sa.Column("procs_max", sa.Integer, nullable=False),
    sa.Column("sys_cpu_util_avg_pct", Measured),
    sa.Column("iowait_s", Measured),
    sa.Column("sys_mem_used_max_b", sa.BigInteger),
    sa.Column("disk_read_b", sa.BigInteger),
    sa.Column("disk_write_b", sa.BigInteger),
    sa.Column("net_rx_b", sa.BigInteger),
    sa.Column("net_tx_b", sa.BigInteger),
)

# seq numbers a run's events / metrics 0, 1, 2 ...: the idempotency key (see Ledger.append).
events = sa.Table(
    "events",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("t", sa.Double, nullable=False),
    sa.Column("kind", sa.String, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("payload", Json, nullable=False),
    sa.Index("ix_events_kind_t", "kind", "t"),  # alerts across runs
)

metrics = sa.Table(
    "metrics",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("t", sa.Double, nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("value", MetricValue, nullable=False),
    sa.Column("epoch", sa.Integer),
    sa.Column("step", sa.Integer),
    sa.Index("ix_metrics_run_id_key", "run_id", "key"),  # compare one metric across runs
)

logs = sa.Table(
    "logs",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("size_b", sa.BigInteger, nullable=False),
    sa.Column("truncated", sa.Boolean, nullable=False),
)

# Per run, GPU model and UTC day: the sums of the GPU intervals, as the cost model prices them (the
# run's own share of a shared GPU, held time up to the last interval of a killed run: core/pricing/usage.py).
# Derived and rebuildable; reports read it instead of the intervals when it is there (migration 2).
# One row sums the run's GPUs of one name and MIG profile ('' = a whole GPU), so a report reads
# about one row per run and day.
gpu_rollups = sa.Table(
    "gpu_rollups",
    metadata,
    sa.Column("run_id", sa.String, _run_fk(), primary_key=True),
    sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),  # days since 1970-01-01 UTC
    sa.Column("gpu_name", sa.Text, primary_key=True),  # the devices' name ('' when unknown)
    sa.Column("mig_profile", sa.String, primary_key=True),  # '' for whole GPUs
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("t0", sa.Double, nullable=False),
    sa.Column("t1", sa.Double, nullable=False),
    sa.Column("alloc_s", sa.Double, nullable=False),
    sa.Column("busy_s", Measured),
    sa.Column("energy_j", Measured),
    sa.Column("intervals", sa.Integer, nullable=False),
    sa.Column("share_rule", sa.String),
    # Copies of the run's grouping values (migration 5), so a report sums earlier months per
    # group in one scan of this table, without a join.
    sa.Column("team", sa.Text),
    sa.Column("project", sa.Text),
    sa.Column("user", sa.Text),
    sa.Column("instance_type", sa.Text),
    # Whether the row's GPUs measured busy time (busy_s is not NULL), in the key since migration 10:
    # a GPU billed its held hours by rule must never share a row, and so a sum, with measured ones.
    sa.Column("measured", sa.Boolean, primary_key=True, autoincrement=False),
    sa.Index("ix_gpu_rollups_day", "day"),
)

# The team server's tables (accounts, tokens, audit chain, agent outbox, rollup marks): migration 3.
_team = schema_team.define(metadata, Json)
users = _team[schema_team.USERS]
projects = _team[schema_team.PROJECTS]
memberships = _team[schema_team.MEMBERSHIPS]
api_tokens = _team[schema_team.API_TOKENS]
audit_log = _team[schema_team.AUDIT_LOG]
push_state = _team[schema_team.PUSH_STATE]
rollup_marks = _team[schema_team.ROLLUP_MARKS]
# Signatures of the audit chain (migration 7): each row's Ed25519 signature and the id of the key
# that made it (core/audit/signing.py); NULL on a chain written without a key.
audit_log.append_column(sa.Column("key_id", sa.String(16)))
audit_log.append_column(sa.Column("sig", sa.Text))
# The entries of one action since a time (migration 22): the tier store's window pass reads only
# the tier entries written since its last window (store/series_window.py).
sa.Index("ix_audit_log_action_t", audit_log.c.action, audit_log.c.t)

# Ownership (migration 7): the principal each run belongs to, the host each GPU belongs to.
_owners = schema_audit.define(metadata)
run_owners = _owners[schema_audit.RUN_OWNERS]
gpu_owners = _owners[schema_audit.GPU_OWNERS]

# Partial acceptance and liveness of pushes (migration 8): quarantined rows, last push per run, and
# on an agent's local ledger what its servers quarantined.
_ingest = schema_ingest.define(metadata)
quarantined_rows = _ingest[schema_ingest.QUARANTINED_ROWS]
run_liveness = _ingest[schema_ingest.RUN_LIVENESS]
push_quarantine = _ingest[schema_ingest.PUSH_QUARANTINE]

# The capacity ledger and the fleet inventory (migration 9; docs/CAPACITY.md): per GPU, not per run.
_capacity = schema_capacity.define(metadata)
gpu_capacity = _capacity[schema_capacity.GPU_CAPACITY]
gpu_capacity_days = _capacity[schema_capacity.GPU_CAPACITY_DAYS]
gpu_fleet = _capacity[schema_capacity.GPU_FLEET]
gpu_fleet_hosts = _capacity[schema_capacity.GPU_FLEET_HOSTS]
capacity_pushes = _capacity[schema_capacity.CAPACITY_PUSHES]
# The instance type each host's agent named for a GPU (migration 11): a GPU that moves between a
# cloud instance and an on-prem node is priced as each host had it.
gpu_fleet_hosts.append_column(sa.Column("instance_type", sa.Text))

# Refused pushes folded in the audit trail, per token (migration 16; store/refusal_trail.py).
refusal_folds = schema_refusals.define(metadata)

# A run's model line, weights and parent, for lookup (migration 17; store/lineage.py).
run_lineage = schema_lineage.define(metadata)

# Runs whose raw intervals the series store holds, and the seq ranges it holds for them
# (migration 19; store/series_segments.py).
series_only_runs, series_segments, series_day_sums = schema_series_only.define(metadata)
# Per stream of such a run, the host CPU, throttle sums and last-row gauges /metrics reads
# (migration 20; store/series_streams.py).
series_streams = schema_series_streams.define(metadata)

# Children of a run, in the order they are deleted.
RUN_CHILDREN = (
    run_labels, devices, gpu_intervals, host_intervals, events, metrics, logs, gpu_rollups, rollup_marks,
    quarantined_rows, run_liveness, run_owners, run_lineage, series_segments, series_day_sums,
    series_streams, series_only_runs,
)  # fmt: skip
