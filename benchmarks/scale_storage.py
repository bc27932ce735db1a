"""Bytes at rest per GPU interval: today's PostgreSQL rows beside the compact layouts of docs/SCALE.md
(issue 38, step 1: the layout, measured before it is built).

    python benchmarks/scale_storage.py [--gpus 64] [--hours 24] [--interval 5] [--seed 1]
                                        [--skip-postgres] [--skip-clickhouse] [--batch 60] [--ch-batch 720]

Telemetry: every GPU's day is cut from the GPU traces gpuledger ships for `--replay-gpus`
(collect/traces: two A100s training with input-starved epoch ends, one H100 with idle gaps),
as windows of 30-180 s at a random offset, a per-GPU power scale of ±5 % and idle stretches of
1-30 min between jobs (a third of the day), then summed into intervals exactly as the recorder sums
its ticks (busy and energy integrals, memory and power maxima, clock means, temperature max).
So the columns move as real telemetry does (steps, plateaus, idle runs), not as random noise.

Stores, all holding the same intervals:
- ``pg-today``: gpuledger's own ``gpu_intervals`` table (store/schema.py), UUID strings as keys;
- ``pg-compact``: integer fixed-point columns (ms, mJ, MiB, 0.01 %, 0.1 W), a 4-byte GPU key and
  run key, primary key (gpu, t0), columns ordered so no alignment padding is wasted;
- ``pg-compact-store``: gpuledger's compact PostgreSQL series store (series/postgres.py), filled
  through its ``write()`` with ledger rows, as the server would: batches of ``--batch`` intervals
  per run, the GPUs' batches interleaved in time order; ``pg-compact-store-closed``: the same once
  the day has ended and the store's hourly ``maintain()`` has rebuilt the day's key index;
- ``parquet-zstd``: the compact columns, sorted by (gpu, t0), ZSTD level 3 (pyarrow);
- ``clickhouse``: the compact columns in a MergeTree ORDER BY (gpu, t0) with per-column codecs,
  in the real ClickHouse engine run in-process (chDB: ``pip install 'gpuledger[clickhouse]'``);
- ``clickhouse-store``: gpuledger's ClickHouse series store (series/clickhouse.py) on chDB, filled
  through its ``write()`` with the same ledger rows in batches of ``--ch-batch`` intervals per run
  (every column the ledger keeps, seq, the three methods and the throttle map included, where
  ``clickhouse`` keeps only the values); ``clickhouse-store-rollups``: the per run x GPU x day
  rollups its view kept.

Printed: rows, bytes at rest (PostgreSQL: table + indexes + TOAST after VACUUM; Parquet: the file;
ClickHouse: bytes on disk of the active parts after OPTIMIZE FINAL) and bytes per interval.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

TRACES = Path(__file__).resolve().parent.parent / "src" / "gpuledger" / "collect" / "traces"
PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
FIELDS = ("util", "power", "mem", "temp", "sm", "memclk", "proc_mem", "proc_sm")


def _templates() -> list[dict[str, np.ndarray]]:
    """Per-second series of each GPU in the shipped traces (values are stepped between points)."""
    out = []
    for path in sorted(TRACES.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line and not line.startswith("#")]
        for gpu in rows[0]["gpus"]:
            pts = sorted((r for r in rows[1:] if r["gpu"] == gpu["uuid"]), key=lambda r: r["t"])
            n = int(pts[-1]["t"]) + 1
            series = {f: np.zeros(n) for f in FIELDS}
            for i, p in enumerate(pts):
                end = int(pts[i + 1]["t"]) if i + 1 < len(pts) else n
                run = p.get("procs", {}).get("run", {})
                for f, v in zip(
                    FIELDS,
                    (p["util_pct"], p["power_w"], p["mem_used_b"], p["temp_c"], p["sm_clock_mhz"],
                     p["mem_clock_mhz"], run.get("mem_b", 0), run.get("sm_pct", 0)),
                    strict=True,
                ):  # fmt: skip
                    series[f][int(p["t"]) : end] = v
            out.append(series)
    return out


def _gpu_day(rng: np.random.Generator, templates: list[dict[str, np.ndarray]], seconds: int) -> dict[str, np.ndarray]:
    """One GPU's per-second telemetry for ``seconds``: training windows and idle stretches."""
    parts: dict[str, list[np.ndarray]] = {f: [] for f in FIELDS}
    scale = rng.uniform(0.95, 1.05)
    filled = 0
    while filled < seconds:
        if rng.random() < 0.15:  # between jobs: idle, memory released, clocks down
            n = int(rng.integers(60, 1800))
            idle = {"util": 0.0, "power": 60.0 * scale, "mem": 0.0, "temp": 31.0, "sm": 210.0,
                    "memclk": 405.0, "proc_mem": 0.0, "proc_sm": 0.0}  # fmt: skip
            for f in FIELDS:
                parts[f].append(np.full(n, idle[f]))
        else:
            t = templates[int(rng.integers(len(templates)))]
            length = len(t["util"])
            start = int(rng.integers(length))
            n = int(rng.integers(30, 180))
            idx = (start + np.arange(n)) % length
            for f in FIELDS:
                v = t[f][idx]
                parts[f].append(v * scale if f == "power" else v)
        filled += n
    day = {f: np.concatenate(parts[f])[:seconds] for f in FIELDS}
    # Sensor noise a trace's steps leave out: NVML's power reading wobbles about 1 % second to
    # second, a busy GPU's utilisation sample by a few percent, the SM clock by a boost bin or two.
    busy = day["util"] > 0
    day["power"] = np.round(day["power"] * rng.normal(1.0, 0.01, seconds), 3)
    day["util"] = np.where(busy, np.clip(np.rint(day["util"] + rng.normal(0, 2, seconds)), 1, 100), 0)
    day["sm"] = np.where(busy, day["sm"] + 15 * rng.integers(-1, 2, seconds), day["sm"])
    return day


def intervals(gpus: int, hours: float, interval_s: int, seed: int) -> dict[str, np.ndarray]:
    """Every GPU's intervals as exact sums of its per-second telemetry, in the compact units."""
    rng = np.random.default_rng(seed)
    templates = _templates()
    seconds = int(hours * 3600) // interval_s * interval_s
    n = seconds // interval_s
    t_start_ms = int((time.time() - 30 * 86400) // 86400 * 86400 * 1000)
    cols: dict[str, list[np.ndarray]] = {}

    def add(name: str, values: np.ndarray) -> None:
        cols.setdefault(name, []).append(values)

    for g in range(gpus):
        day = _gpu_day(rng, templates, seconds)
        shaped = {f: day[f].reshape(n, interval_s) for f in FIELDS}
        busy_ms = np.rint(shaped["util"].sum(axis=1) * 10).astype(np.int64)  # % x 1 s = 10 ms
        add("gpu", np.full(n, g, dtype=np.int64))
        add("t0_ms", t_start_ms + np.arange(n, dtype=np.int64) * interval_s * 1000)
        add("dur_ms", np.full(n, interval_s * 1000, dtype=np.int64))
        # A run key that changes where the GPU went idle: a new job after each idle stretch.
        idle = shaped["mem"].max(axis=1) == 0
        add("run", g * 100_000 + np.cumsum(np.r_[0, (idle[1:] & ~idle[:-1])]).astype(np.int64))
        add("samples", np.full(n, interval_s * 6, dtype=np.int64))  # ~6 samples/s (a 1/6 s period)
        add("busy_ms", busy_ms)
        add("idle_ms", interval_s * 1000 - busy_ms)
        add("unknown_ms", np.zeros(n, dtype=np.int64))  # sampled time of unknown state: rare, kept
        add("unmeasured_ms", np.zeros(n, dtype=np.int64))
        add("methods", np.full(n, 0b01_01_01, dtype=np.int64))  # util, energy, proc method: 2 bits each
        add("util_max_cp", (shaped["util"].max(axis=1) * 100).astype(np.int64))  # 0.01 %
        add("energy_mj", np.rint(shaped["power"].sum(axis=1) * 1000).astype(np.int64))
        add("power_max_dw", np.rint(shaped["power"].max(axis=1) * 10).astype(np.int64))  # 0.1 W
        add("mem_max_mib", (shaped["mem"].max(axis=1) // 2**20).astype(np.int64))
        add("mem_last_mib", (shaped["mem"][:, -1] // 2**20).astype(np.int64))
        add("proc_mem_max_mib", (shaped["proc_mem"].max(axis=1) // 2**20).astype(np.int64))
        add("proc_sm_cp", np.rint(shaped["proc_sm"].mean(axis=1) * 100).astype(np.int64))
        add("temp_max_dc", np.rint(shaped["temp"].max(axis=1) * 10).astype(np.int64))  # 0.1 C
        add("sm_clock_mhz", np.rint(shaped["sm"].mean(axis=1)).astype(np.int64))
        add("mem_clock_mhz", shaped["memclk"].max(axis=1).astype(np.int64))
        add("throttle_power_ms", np.zeros(n, dtype=np.int64))
        add("throttle_thermal_ms", np.zeros(n, dtype=np.int64))
    return {k: np.concatenate(v) for k, v in cols.items()}


# (column, PostgreSQL type, ClickHouse type and codec), widest first: no alignment padding in a row.
COMPACT = (
    ("t0_ms", "bigint", "Int64 CODEC(DoubleDelta, ZSTD(3))"),
    ("gpu", "integer", "UInt32 CODEC(ZSTD(3))"),
    ("run", "integer", "UInt32 CODEC(Delta, ZSTD(3))"),
    ("dur_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("busy_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("idle_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("unknown_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("unmeasured_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("energy_mj", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("mem_max_mib", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("mem_last_mib", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("proc_mem_max_mib", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("throttle_power_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("throttle_thermal_ms", "integer", "UInt32 CODEC(T64, ZSTD(3))"),
    ("samples", "smallint", "UInt16 CODEC(T64, ZSTD(3))"),
    ("util_max_cp", "smallint", "UInt16 CODEC(T64, ZSTD(3))"),
    ("power_max_dw", "smallint", "UInt16 CODEC(T64, ZSTD(3))"),
    ("proc_sm_cp", "smallint", "UInt16 CODEC(T64, ZSTD(3))"),
    ("temp_max_dc", "smallint", "Int16 CODEC(T64, ZSTD(3))"),
    ("sm_clock_mhz", "smallint", "UInt16 CODEC(T64, ZSTD(3))"),
    ("mem_clock_mhz", "smallint", "UInt16 CODEC(T64, ZSTD(3))"),
    ("methods", "smallint", "UInt8 CODEC(ZSTD(3))"),
)


def _copy(cur: object, table: str, columns: list[str], rows: list[tuple[object, ...]]) -> None:
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
        for row in rows:
            copy.write_row(row)


def pg_sizes(data: dict[str, np.ndarray]) -> dict[str, int]:
    """Bytes at rest on PostgreSQL: today's gpu_intervals table and the compact table."""
    import psycopg
    import sqlalchemy as sa

    from gpuledger.store import schema as gl_schema

    schema = f"scale_{uuid.uuid4().hex[:8]}"
    out: dict[str, int] = {}
    with psycopg.connect(PG, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE SCHEMA {schema}")
        try:
            engine = sa.create_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1))
            with engine.begin() as sconn:
                sconn.execute(sa.text(f"SET search_path TO {schema}"))
                gl_schema.metadata.create_all(sconn, tables=[gl_schema.runs, gl_schema.gpu_intervals])
            engine.dispose()
            cur.execute(f"SET search_path TO {schema}")
            n = len(data["gpu"])
            uuids = [f"GPU-{uuid.UUID(int=g + 1)}" for g in range(int(data["gpu"].max()) + 1)]
            run_ids = {r: str(uuid.uuid4()) for r in np.unique(data["run"]).tolist()}
            cur.execute("ALTER TABLE gpu_intervals DROP CONSTRAINT IF EXISTS gpu_intervals_run_id_fkey")
            seq: dict[int, int] = {}
            today = []
            for i in range(n):
                g, r = int(data["gpu"][i]), int(data["run"][i])
                seq[r] = seq.get(r, -1) + 1
                t0 = data["t0_ms"][i] / 1000
                busy = data["busy_ms"][i] / 1000
                today.append((
                    run_ids[r], uuids[g], seq[r], t0, t0 + data["dur_ms"][i] / 1000, int(data["samples"][i]),
                    busy, "samples", data["util_max_cp"][i] / 100, data["idle_ms"][i] / 1000, 0.0, 0.0,
                    data["energy_mj"][i] / 1000, "counter", data["power_max_dw"][i] / 10,
                    int(data["mem_max_mib"][i]) << 20, int(data["mem_last_mib"][i]) << 20, 553648128,
                    int(data["proc_mem_max_mib"][i]) << 20, data["proc_sm_cp"][i] / 100, "pid",
                    data["temp_max_dc"][i] / 10, float(data["sm_clock_mhz"][i]), float(data["mem_clock_mhz"][i]),
                    "{}",
                ))  # fmt: skip
            cols = [
                "run_id", "device_uuid", "seq", "t0", "t1", "samples", "busy_s", "util_method", "util_max_pct",
                "util_idle_s", "util_unknown_s", "util_unmeasured_s", "energy_j", "energy_method", "power_max_w",
                "mem_used_max_b", "mem_used_last_b", "mem_reserved_b", "proc_mem_max_b", "proc_sm_util_avg_pct",
                "proc_method", "temp_max_c", "sm_clock_avg_mhz", "mem_clock_max_mhz", "throttle_s",
            ]  # fmt: skip
            _copy(cur, "gpu_intervals", cols, today)
            cur.execute(
                "CREATE TABLE gpu_iv_compact ("
                + ", ".join(f"{c} {t} NOT NULL" for c, t, _ in COMPACT)
                + ", PRIMARY KEY (gpu, t0_ms))"
            )
            names = [c for c, _, _ in COMPACT]
            order = np.lexsort((data["t0_ms"], data["gpu"]))
            _copy(cur, "gpu_iv_compact", names, [tuple(int(data[c][i]) for c in names) for i in order])
            for table, key in (("gpu_intervals", "pg-today"), ("gpu_iv_compact", "pg-compact")):
                cur.execute(f"VACUUM (ANALYZE) {table}")
                cur.execute("SELECT pg_total_relation_size(%s)", (table,))
                out[key] = int(cur.fetchone()[0])  # type: ignore[index]
        finally:
            cur.execute(f"DROP SCHEMA {schema} CASCADE")
    return out


def ledger_rows(data: dict[str, np.ndarray]) -> list[tuple[str, dict[str, object]]]:
    """The intervals as the ledger's GPU rows (store/schema.py gpu_intervals), (run id, row) in
    time order, seq counted per run."""
    uuids = [f"GPU-{uuid.UUID(int=g + 1)}" for g in range(int(data["gpu"].max()) + 1)]
    run_ids = {r: f"run-{r}" for r in np.unique(data["run"]).tolist()}
    seq: dict[int, int] = {}
    out = []
    for i in np.lexsort((data["gpu"], data["t0_ms"])).tolist():
        g, r = int(data["gpu"][i]), int(data["run"][i])
        seq[r] = seq.get(r, -1) + 1
        t0 = int(data["t0_ms"][i]) / 1000
        row = {
            "device_uuid": uuids[g], "seq": seq[r], "t0": t0, "t1": t0 + int(data["dur_ms"][i]) / 1000,
            "samples": int(data["samples"][i]), "busy_s": int(data["busy_ms"][i]) / 1000, "util_method": "samples",
            "util_max_pct": int(data["util_max_cp"][i]) / 100, "util_idle_s": int(data["idle_ms"][i]) / 1000,
            "util_unknown_s": 0.0, "util_unmeasured_s": 0.0, "energy_j": int(data["energy_mj"][i]) / 1000,
            "energy_method": "counter", "power_max_w": int(data["power_max_dw"][i]) / 10,
            "mem_used_max_b": int(data["mem_max_mib"][i]) << 20, "mem_used_last_b": int(data["mem_last_mib"][i]) << 20,
            "mem_reserved_b": 553648128, "proc_mem_max_b": int(data["proc_mem_max_mib"][i]) << 20,
            "proc_sm_util_avg_pct": int(data["proc_sm_cp"][i]) / 100, "proc_method": "pid",
            "temp_max_c": int(data["temp_max_dc"][i]) / 10, "sm_clock_avg_mhz": float(data["sm_clock_mhz"][i]),
            "mem_clock_max_mhz": float(data["mem_clock_mhz"][i]),
            "throttle_s": {"power": int(data["throttle_power_ms"][i]) / 1000,
                           "thermal": int(data["throttle_thermal_ms"][i]) / 1000},
        }  # fmt: skip
        out.append((run_ids[r], row))
    return out


def batches(data: dict[str, np.ndarray], batch: int) -> Iterator[tuple[str, list[dict[str, object]]]]:
    """(run id, rows) as the server would write them: each run's rows in batches of ``batch``
    intervals, the runs' batches interleaved in time order, then each run's last partial batch."""
    pending: dict[str, list[dict[str, object]]] = {}
    for run_id, row in ledger_rows(data):
        rows = pending.setdefault(run_id, [])
        rows.append(row)
        if len(rows) == batch:
            yield run_id, rows
            del pending[run_id]
    yield from pending.items()


def pg_store_size(data: dict[str, np.ndarray], batch: int) -> dict[str, int]:
    """Bytes at rest in gpuledger's compact PostgreSQL series store, written through its write():
    each run's rows in batches of ``batch`` intervals, the runs' batches interleaved in time; as
    written (``pg-compact-store``) and after the server's hourly ``maintain()`` once the day has
    ended (``pg-compact-store-closed``: the day's key index rebuilt full)."""
    import psycopg

    from gpuledger.series.postgres import PostgresSeries

    schema = f"scale_{uuid.uuid4().hex[:8]}"
    store = PostgresSeries(PG, schema)
    try:
        store.create()
        n = sum(store.write(run_id, rows, [], f"{run_id}:{rows[0]['seq']}") for run_id, rows in batches(data, batch))
        assert n == len(data["gpu"]), (n, len(data["gpu"]))
        out = {}
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"VACUUM (ANALYZE) {schema}.gpu_iv")
            out["pg-compact-store"] = store.bytes_at_rest()
            store.maintain()  # now: every written day ended weeks ago
            conn.execute(f"VACUUM (ANALYZE) {schema}.gpu_iv")
            out["pg-compact-store-closed"] = store.bytes_at_rest()
            # Not in bytes_at_rest (not the intervals'): the batch tokens, one row per write().
            out["(its batch tokens)"] = int(
                conn.execute("SELECT pg_total_relation_size(%s)", (f"{schema}.batches",)).fetchone()[0]  # type: ignore[index]
            )
        return out
    finally:
        store.close()
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def clickhouse_store_size(data: dict[str, np.ndarray], folder: Path, batch: int) -> dict[str, int]:
    """Bytes at rest in gpuledger's ClickHouse series store (series/clickhouse.py, chDB), written
    through its write() in batches of ``batch`` intervals per run, after the engine has merged the
    parts (OPTIMIZE FINAL: what background merges reach; a part's bytes depend on its rows, not on
    how they arrived). Also the per run x GPU x day rollups the view kept."""
    from gpuledger.series.clickhouse import ClickHouseSeries

    store = ClickHouseSeries(f"chdb://{folder}/series", raw_days=3650)  # the telemetry is a month old
    try:
        store.create()
        n = sum(store.write(run_id, rows, [], f"{run_id}:{rows[0]['seq']}") for run_id, rows in batches(data, batch))
        assert n == len(data["gpu"]), (n, len(data["gpu"]))
        store.compact()
        rollups = store.client.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = {db:String} "
            "AND table = 'gpu_day_rollups' AND active",
            {"db": store.layout.database},
        )[0][0]
        return {"clickhouse-store": store.bytes_at_rest(), "clickhouse-store-rollups": int(rollups)}
    finally:
        store.close()


def parquet_size(data: dict[str, np.ndarray], folder: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    order = np.lexsort((data["t0_ms"], data["gpu"]))
    types = {"bigint": pa.int64(), "integer": pa.uint32(), "smallint": pa.int16()}
    table = pa.table({c: pa.array(data[c][order], type=types[t]) for c, t, _ in COMPACT})
    path = folder / "intervals.parquet"
    pq.write_table(table, path, compression="zstd", compression_level=3)
    return path.stat().st_size


def clickhouse_size(data: dict[str, np.ndarray], folder: Path) -> int:
    import pyarrow as pa
    from chdb import session

    sess = session.Session(str(folder / "ch"))
    try:
        sess.query("CREATE DATABASE IF NOT EXISTS bench")
        ddl = ", ".join(f"{c} {t}" for c, _, t in COMPACT)
        sess.query(f"CREATE TABLE bench.gpu_iv ({ddl}) ENGINE = MergeTree ORDER BY (gpu, t0_ms)")
        arrow = pa.table({c: data[c] for c, _, _ in COMPACT})
        with tempfile.NamedTemporaryFile(suffix=".arrow", dir=folder, delete=False) as f:
            with pa.ipc.new_file(f, arrow.schema) as writer:
                writer.write_table(arrow)
            src = f.name
        sess.query(f"INSERT INTO bench.gpu_iv SELECT * FROM file('{src}', 'Arrow')")
        sess.query("OPTIMIZE TABLE bench.gpu_iv FINAL")
        res = sess.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = 'bench' AND table = 'gpu_iv' AND active",
            "CSV",
        )
        return int(io.StringIO(str(res)).read().strip())
    finally:
        sess.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--interval", type=int, default=5, help="seconds per interval (default 5)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-postgres", action="store_true")
    ap.add_argument("--skip-clickhouse", action="store_true")
    ap.add_argument("--batch", type=int, default=60, help="intervals per write() of pg-compact-store (default 60)")
    ap.add_argument(
        "--ch-batch", type=int, default=720, help="intervals per write() of clickhouse-store (default 720: an hour)"
    )
    args = ap.parse_args()
    data = intervals(args.gpus, args.hours, args.interval, args.seed)
    n = len(data["gpu"])
    busy = data["busy_ms"].sum() / data["dur_ms"].sum()
    print(f"{n:,} intervals: {args.gpus} GPUs x {args.hours:g} h at {args.interval} s, mean busy {busy:.1%}")
    sizes: dict[str, int] = {}
    if not args.skip_postgres:
        sizes.update(pg_sizes(data))
        t = time.perf_counter()
        sizes.update(pg_store_size(data, args.batch))
        print(f"pg-compact-store: written through write() in {time.perf_counter() - t:.0f} s")
    with tempfile.TemporaryDirectory() as tmp:
        sizes["parquet-zstd"] = parquet_size(data, Path(tmp))
        if not args.skip_clickhouse:
            sizes["clickhouse"] = clickhouse_size(data, Path(tmp))
            t = time.perf_counter()
            sizes.update(clickhouse_store_size(data, Path(tmp), args.ch_batch))
            took = time.perf_counter() - t
            print(f"clickhouse-store: written through write() in {took:.0f} s ({n / took:,.0f} intervals/s)")
    print(f"{'store':<25}{'bytes at rest':>16}{'B/interval':>12}")
    for name, size in sizes.items():
        print(f"{name:<25}{size:>16,}{size / n:>12.1f}")


if __name__ == "__main__":
    main()
