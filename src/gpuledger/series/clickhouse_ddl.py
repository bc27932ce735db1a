"""The ClickHouse tables of the raw-interval store (docs/SCALE.md, step 3), for one node and for a
cluster, from one description, so the cluster's DDL (deploy/clickhouse/schema.sql) is the tested
single-node DDL with only the engines changed.

- ``gpu_intervals``: one row per GPU interval in the fixed-point units of series/quantum.py,
  ``ORDER BY (gpu, t0)``, a partition per UTC day, the raw window as a TTL that drops whole parts,
  and a minmax skip index on ``seq`` per granule (``SEQ_INDEX``), so a page of a run's rows by seq
  (series/clickhouse_pages.py) reads the granules of its seqs, not the GPU's whole run;
- ``host_intervals``: likewise, ``ORDER BY (run, t0)``;
- ``capacity_intervals``: the node agents' capacity intervals (series/capacity.py), likewise,
  ``ORDER BY (gpu, t0)``;
- ``series_names``: the 64-bit keys (``cityHash64`` of the GPU UUID / run id) back to their names.
  A hash needs no key-allocation table that replicas would have to agree on;
- ``run_dims``: run key -> run id, team, project, user (a ``ReplacingMergeTree`` the server fills
  from its runs; the newest version of a run wins), so chargeback groups the rollups without
  PostgreSQL. On a cluster it is replicated whole to every node (not sharded): each shard joins
  its own rollups to its local copy;
- ``gpu_day_rollups``: per run, GPU and UTC day, summed on insert by a materialised view. An
  interval crossing a UTC midnight is split at it in proportion to its time in each day (the
  ledger's rule, store/cost_queries.py), in integers: the part up to an instant x of a value v is
  round(v * (x - t0) / dur), so the parts of one interval always add up to v exactly; the interval
  itself counts on the day it ends;
- ``run_day_rollups``: per UTC day and run, what chargeback sums (held, busy, energy), summed on
  insert by a second view from the rows the first writes into ``gpu_day_rollups``: a run's GPUs
  folded together, so a year's chargeback reads one row per run and day (13.7 M for 100,000 GPUs
  at three jobs a node a day) instead of one per run, GPU and day (109.5 M), and joins the run's
  team, project and user as one integer (``run_dims.dims``) at query time, so a relabelled run is
  charged to its new owners at once.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY_MS = 86_400_000
DEDUP_WINDOW = 100_000  # recent insert blocks whose tokens are kept: a resent batch in this window is dropped
DEDUP_WINDOW_S = 7 * 86400  # cluster: how long Keeper keeps them (an agent's outbox can lag a week)

Z = "ZSTD(3)"
_TIME = f"DateTime64(3, 'UTC') CODEC(DoubleDelta, {Z})"
_COUNT = f"UInt32 CODEC(T64, {Z})"


def _int(width: int = 64, nullable: bool = True) -> str:
    t = f"Int{width}"
    return f"{'Nullable(' + t + ')' if nullable else t} CODEC(T64, {Z})"


_METHOD = "LowCardinality(Nullable(String))"

# The raw tables' skip index on seq: each granule's (8,192 rows') least and greatest seq, so a page
# ``seq > a AND seq <= b`` skips every granule outside (a, b]. seq is not in the sort key, but an
# agent numbers a run's intervals of a GPU from 0 in time order, so a granule of (gpu, t0) spans few
# seqs. Only the speed depends on that: a read's rows are those of its condition whatever the order.
SEQ_INDEX = ("seq_idx", "seq TYPE minmax GRANULARITY 1")
SEQ_INDEXED = ("gpu_intervals", "host_intervals")

# (column, type and codec). Units: series/quantum.py (ms, mJ, mW, 0.01 %, 0.1 °C, 0.1 MHz; bytes as bytes).
GPU_COLUMNS: tuple[tuple[str, str], ...] = (
    ("gpu", f"UInt64 CODEC({Z})"),  # sorted first: long runs of one value
    ("t0", _TIME),
    ("dur_ms", _COUNT),  # t1 = t0 + dur_ms
    ("run", f"UInt64 CODEC({Z})"),
    ("seq", f"UInt32 CODEC(Delta, {Z})"),
    ("samples", _COUNT),
    ("busy_ms", _int()),
    ("idle_ms", _int()),
    ("unknown_ms", _int()),
    ("unmeasured_ms", _int()),
    ("energy_mj", _int()),
    ("power_max_mw", _int()),
    ("util_max_cp", _int(32)),
    ("proc_sm_cp", _int(32)),
    ("temp_max_dc", _int(32)),
    ("sm_clock_dmhz", _int(32)),
    ("mem_clock_dmhz", _int(32)),
    ("mem_max_b", _int()),
    ("mem_last_b", _int()),
    ("mem_reserved_b", _int()),
    ("proc_mem_max_b", _int()),
    ("util_method", _METHOD),
    ("energy_method", _METHOD),
    ("proc_method", _METHOD),
    ("throttle_ms", f"Map(LowCardinality(String), UInt32) CODEC({Z})"),
    ("throttle_read", f"Bool CODEC({Z})"),  # a Map cannot be Nullable: 0 = throttle_s was None
)

HOST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", f"UInt64 CODEC({Z})"),
    ("t0", _TIME),
    ("dur_ms", _COUNT),
    ("seq", f"UInt32 CODEC(Delta, {Z})"),
    ("samples", _COUNT),
    ("cpu_ms", _int(nullable=False)),
    ("rss_max_b", _int(nullable=False)),
    ("read_b", _int(nullable=False)),
    ("write_b", _int(nullable=False)),
    ("threads_max", _int(32, nullable=False)),
    ("procs_max", _int(32, nullable=False)),
    ("sys_cpu_cp", _int(32)),
    ("iowait_ms", _int()),
    ("sys_mem_used_max_b", _int()),
    ("disk_read_b", _int()),
    ("disk_write_b", _int()),
    ("net_rx_b", _int()),
    ("net_tx_b", _int()),
)

# Capacity intervals (series/capacity.py): per GPU and agent interval, its states in ms and energy
# in mJ; the host as LowCardinality (a few thousand names), the (GPU, start) key the ledger's.
CAPACITY_STATES = ("unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms", "unmeasured_ms")
CAPACITY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("gpu", f"UInt64 CODEC({Z})"),
    ("t0", _TIME),
    ("dur_ms", _COUNT),
    ("host", f"LowCardinality(String) CODEC({Z})"),
    *((c, _COUNT) for c in CAPACITY_STATES),
    ("energy_mj", _int()),
)

NAMES_COLUMNS: tuple[tuple[str, str], ...] = (
    ("kind", "Enum8('gpu' = 1, 'run' = 2)"),
    ("hash", "UInt64"),
    ("name", "String"),
)

DIMS_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "UInt64"),  # cityHash64(run id), as in the other tables
    ("run_id", "String"),
    ("team", "LowCardinality(String)"),
    ("project", "LowCardinality(String)"),
    ("user", "LowCardinality(String)"),
    ("version", "UInt64"),  # the run's last change (ms): the highest wins
    # team x project x user as one integer, computed on insert: chargeback joins and groups it, not three strings
    ("dims", "UInt64 MATERIALIZED cityHash64(team, project, user)"),
)

# Per run, GPU and day; the _n columns count the intervals that measured the value, so a day
# whose GPU measured no busy time stays told apart from one that was idle (as the ledger's sums).
ROLLUP_SUMS = (
    "intervals", "samples", "allocated_ms", "busy_ms", "busy_n", "idle_ms", "idle_n", "unknown_ms", "unknown_n",
    "unmeasured_ms", "unmeasured_n", "energy_mj", "energy_n",
)  # fmt: skip
ROLLUP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "UInt64"),
    ("gpu", "UInt64"),
    ("day", "Date"),
    *((c, "Int64" if c.endswith(("_ms", "_mj")) else "UInt64") for c in ROLLUP_SUMS),
)

# Per UTC day and run: what chargeback sums, the run's GPUs folded together.
CHARGE_SUMS = ("allocated_ms", "busy_ms", "energy_mj")
RUN_DAY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("day", "Date"),
    ("run", "UInt64"),
    *((c, "Int64") for c in CHARGE_SUMS),
)


_MEASURED = ("busy_ms", "idle_ms", "unknown_ms", "unmeasured_ms", "energy_mj")


def _split(v: str) -> str:
    """The part of integer ``v`` that falls in [pa, pb) of an interval [a0, a0 + dur): the
    difference of round-half-up cumulative shares, so the parts add up to ``v`` exactly."""
    cum = "intDiv(toInt128({v}) * ({x} - a0) * 2 + dur, 2 * dur)"
    return f"toInt64(if(dur = 0, {v}, {cum.format(v=v, x='pb')} - {cum.format(v=v, x='pa')}))"


def rollup_select(source: str) -> str:
    """The materialised view's SELECT: each interval as one row per UTC day it overlaps. The
    inner SELECTs make the day parts plain columns (the raw values renamed in_*, as aliases would
    shadow them): the outer sums then stay small expressions, which the engine plans per insert."""
    raw = ("samples", *_MEASURED)
    inner = ", ".join(f"{c} AS in_{c}" for c in raw)
    renamed = ", ".join(f"in_{c}" for c in raw)
    sums = []
    for col in _MEASURED:
        sums.append(f"{_split(f'ifNull(in_{col}, 0)')} AS {col}")
        sums.append(f"toUInt64(isNotNull(in_{col})) AS {col[:-3]}_n")
    days = f"arrayJoin(range(intDiv(a0, {DAY_MS}), intDiv(if(dur = 0, a0, a1 - 1), {DAY_MS}) + 1))"
    return (
        "SELECT run, gpu, CAST(d AS Date) AS day,\n"
        "    toUInt64(pb = a1) AS intervals,\n"
        f"    toUInt64({_split('in_samples')}) AS samples,\n"
        "    pb - pa AS allocated_ms,\n    " + ",\n    ".join(sums) + "\n"
        f"FROM (SELECT *, greatest(a0, d * {DAY_MS}) AS pa, least(a1, (d + 1) * {DAY_MS}) AS pb\n"
        f"    FROM (SELECT run, gpu, a0, dur, a1, {days} AS d, {renamed}\n"
        f"        FROM (SELECT run, gpu, toUnixTimestamp64Milli(t0) AS a0, toInt64(dur_ms) AS dur, a0 + dur AS a1,\n"
        f"            {inner} FROM {source})))"
    )


@dataclass(frozen=True)
class Layout:
    """Where and how: ``cluster`` None for one node (chDB, a single server); else the cluster's
    name in remote_servers, and every table is a ReplicatedMergeTree per shard (``*_local``)
    behind a Distributed table of the plain name."""

    database: str
    raw_days: int = 7
    cluster: str | None = None

    def table(self, name: str) -> str:
        """The table the store reads and writes (the Distributed one on a cluster)."""
        return f"{self.database}.{name}"

    def local_name(self, name: str) -> str:
        return f"{name}_local" if self.cluster else name

    def local(self, name: str) -> str:
        """The table that holds the rows (each shard's own on a cluster)."""
        return f"{self.database}.{self.local_name(name)}"

    def on(self) -> str:
        return f" ON CLUSTER '{self.cluster}'" if self.cluster else ""

    def parts(self) -> str:
        """Where the engine lists the tables' parts: every replica's on a cluster."""
        return f"clusterAllReplicas('{self.cluster}', system.parts)" if self.cluster else "system.parts"

    def _engine(self, kind: str, name: str, args: str = "", every_node: bool = False) -> str:
        if not self.cluster:
            return f"{kind}({args})"
        shard = "all" if every_node else "{shard}"  # one replication group over every node of every shard
        path = f"'/clickhouse/tables/{shard}/{self.database}/{name}', '{{replica}}'"
        return f"Replicated{kind}({path}{', ' + args if args else ''})"

    def _dedup(self) -> str:
        if self.cluster:
            return (
                f"replicated_deduplication_window = {DEDUP_WINDOW}, "
                f"replicated_deduplication_window_seconds = {DEDUP_WINDOW_S}"
            )
        return f"non_replicated_deduplication_window = {DEDUP_WINDOW}"

    def ttl(self) -> str:
        return f"toDateTime(t0) + INTERVAL {self.raw_days} DAY DELETE"

    def _create(
        self, name: str, columns: tuple[tuple[str, str], ...], tail: str, indexes: tuple[tuple[str, str], ...] = ()
    ) -> str:
        cols = ",\n".join([*(f"    {c} {t}" for c, t in columns), *(f"    INDEX {i} {d}" for i, d in indexes)])
        return f"CREATE TABLE IF NOT EXISTS {self.local(name)}{self.on()}\n(\n{cols}\n)\n{tail}"

    def _raw(self, name: str, columns: tuple[tuple[str, str], ...], order: str) -> str:
        return self._create(
            name,
            columns,
            f"ENGINE = {self._engine('MergeTree', name)}\nPARTITION BY toDate(t0)\nORDER BY ({order})\n"
            f"TTL {self.ttl()}\nSETTINGS ttl_only_drop_parts = 1, {self._dedup()}",
            (SEQ_INDEX,) if name in SEQ_INDEXED else (),
        )

    def _distributed(self, name: str, key: str) -> list[str]:
        if not self.cluster:
            return []
        return [
            f"CREATE TABLE IF NOT EXISTS {self.table(name)}{self.on()} AS {self.local(name)}\n"
            f"ENGINE = Distributed('{self.cluster}', {self.database}, {name}_local, {key})"
        ]

    def statements(self) -> list[str]:
        """Every statement, in order; each is idempotent (IF NOT EXISTS)."""
        out = [f"CREATE DATABASE IF NOT EXISTS {self.database}{self.on()}"]
        out.append(self._raw("gpu_intervals", GPU_COLUMNS, "gpu, t0"))
        out += self._distributed("gpu_intervals", "gpu")  # one GPU's intervals live on one shard
        out.append(self._raw("host_intervals", HOST_COLUMNS, "run, t0"))
        out += self._distributed("host_intervals", "run")
        out.append(self._raw("capacity_intervals", CAPACITY_COLUMNS, "gpu, t0"))
        out += self._distributed("capacity_intervals", "gpu")  # beside the GPU's own intervals
        out.append(
            self._create(
                "series_names",
                NAMES_COLUMNS,
                f"ENGINE = {self._engine('ReplacingMergeTree', 'series_names')}\nORDER BY (kind, hash)\n"
                f"SETTINGS {self._dedup()}",
            )
        )
        out += self._distributed("series_names", "hash")
        out.append(
            self._create(
                "run_dims",
                DIMS_COLUMNS,
                f"ENGINE = {self._engine('ReplacingMergeTree', 'run_dims', 'version', every_node=True)}\nORDER BY run",
            )
        )
        out.append(
            self._create(
                "gpu_day_rollups",
                ROLLUP_COLUMNS,
                f"ENGINE = {self._engine('SummingMergeTree', 'gpu_day_rollups')}\nPARTITION BY toYYYYMM(day)\n"
                f"ORDER BY (run, gpu, day)\nSETTINGS {self._dedup()}",
            )
        )
        # The view reads each shard's own inserts and writes that shard's rollups: sharded by gpu,
        # a run's day on one GPU is summed on one shard.
        out += self._distributed("gpu_day_rollups", "gpu")
        out.append(
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {self.local('gpu_day_rollups_mv')}{self.on()}\n"
            f"TO {self.local('gpu_day_rollups')}\nAS {rollup_select(self.local('gpu_intervals'))}"
        )
        out += self.run_day_statements()
        return out

    def seq_index(self, name: str) -> str:
        """The skip index added to a raw table made before it (metadata only: parts written before
        have no index and are read whole, as before, until a merge rewrites them or the raw window
        drops them; ``ALTER TABLE ... MATERIALIZE INDEX seq_idx`` builds it for them at once)."""
        index, definition = SEQ_INDEX
        return f"ALTER TABLE {self.local(name)}{self.on()} ADD INDEX IF NOT EXISTS {index} {definition}"

    def run_day_statements(self) -> list[str]:
        """``run_day_rollups`` and its view, fed by what the first view writes into each shard's
        ``gpu_day_rollups`` (a view on a view's target table runs on the same insert, with the same
        deduplication of a resent block)."""
        return [
            self._create(
                "run_day_rollups",
                RUN_DAY_COLUMNS,
                f"ENGINE = {self._engine('SummingMergeTree', 'run_day_rollups')}\nPARTITION BY toYYYYMM(day)\n"
                f"ORDER BY (day, run)\nSETTINGS {self._dedup()}",
            ),
            *self._distributed("run_day_rollups", "run"),
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {self.local('run_day_rollups_mv')}{self.on()}\n"
            f"TO {self.local('run_day_rollups')}\nAS {self.run_day_select()}",
        ]

    def run_day_select(self) -> str:
        sums = ", ".join(f"sum({c}) AS {c}" for c in CHARGE_SUMS)
        return f"SELECT day, run, {sums}\nFROM {self.local('gpu_day_rollups')}\nGROUP BY day, run"

    def script(self) -> str:
        return ";\n\n".join(self.statements()) + ";\n"


def schema_sql(database: str = "gpuledger", cluster: str = "gpuledger", raw_days: int = 7) -> str:
    """The cluster DDL committed as deploy/clickhouse/schema.sql."""
    head = (
        "-- gpuledger's raw-interval store on a ClickHouse cluster (docs/SCALE.md, step 3).\n"
        "-- Generated by gpuledger.series.clickhouse_ddl.schema_sql(); tests/test_series_clickhouse_ddl.py\n"
        "-- checks this file equals its output. Run once against any node:\n"
        "--   clickhouse-client --multiquery < schema.sql\n\n"
    )
    return head + Layout(database, raw_days, cluster).script()
