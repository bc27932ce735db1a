"""The raw-interval store on ClickHouse (docs/SCALE.md, step 3): series/base.SeriesStore over the
tables of series/clickhouse_ddl.py, through either client of series/clickhouse_client.py.

    store = ClickHouseSeries("chdb:///var/lib/gpuledger/series")   # or clickhouse://u:p@host:8123/db
    store.create()
    store.write(run_id, gpu_rows, host_rows, token="run:dev:0-719")

A batch is one INSERT per table with ``insert_deduplication_token`` = its token, so a batch sent
again (an agent retrying after a lost acknowledgement, a server replica that died mid-write) is
dropped by the engine, and ``deduplicate_blocks_in_dependent_materialized_views`` keeps the
rollup view from summing it twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import date, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuledger.series import capacity, clickhouse_capacity, clickhouse_pages, clickhouse_repair
from gpuledger.series.base import DayRollup, Row
from gpuledger.series.clickhouse_client import ClickHouseError, Client, connect
from gpuledger.series.clickhouse_columns import gpu_columns
from gpuledger.series.clickhouse_ddl import DIMS_COLUMNS, ROLLUP_SUMS, SEQ_INDEX, SEQ_INDEXED, Layout
from gpuledger.series.clickhouse_hash import city_hash64
from gpuledger.series.clickhouse_keyed import gpu_between, held, held_group, host_between
from gpuledger.series.clickhouse_rows import (
    GPU_SELECT,
    HOST_INSERT,
    HOST_SELECT,
    BadRow,
    gpu_back,
    host_back,
    host_row,
)

__all__ = ["BadRow", "ClickHouseError", "ClickHouseSeries"]

DAY_S = 86400
# Every insert: exactly once (the token), rollups too. No JIT of the rollup view's expressions:
# compiling them took twice as long as the rest of a 60-row insert (chDB 26.9: 99 ms -> 35 ms).
_WRITE_SETTINGS = {
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    "insert_deduplicate": 1,
    "compile_expressions": 0,
}


def _t0_range(times: list[str]) -> dict[str, str]:
    """The first and last of converted t0s, as the engine's DateTime64 text."""
    return {"a": min(times, key=float), "b": max(times, key=float)}


def _days(rows: dict[str, list[Any]] | list[dict[str, Any]] | None) -> set[int]:
    """The UTC days (partitions) of converted rows' t0s, given column-wise or row by row."""
    if not rows:
        return set()
    times = rows["t0"] if isinstance(rows, dict) else [r["t0"] for r in rows]
    return {int(t.partition(".")[0]) // DAY_S for t in times}


class ClickHouseSeries:
    """Raw GPU and host intervals in ClickHouse, rolled up per run, GPU and UTC day on insert."""

    def __init__(self, url: str, *, raw_days: int = 7, client: Client | None = None) -> None:
        """``url``: chdb:///abs/folder, or clickhouse://user:password@host:8123/db, with
        ``?cluster=NAME`` for a cluster laid out as deploy/clickhouse/schema.sql (not run here:
        deploy/clickhouse/README.md)."""
        if raw_days < 1:
            raise ValueError(f"raw_days must be at least 1, not {raw_days}")
        cluster = parse_qs(urlsplit(url).query).get("cluster", [None])[0]
        if cluster is not None and (not cluster.replace("_", "").isalnum() or url.startswith("chdb:")):
            raise ClickHouseError(f"?cluster= names a cluster of ClickHouse servers (letters, digits, _): {cluster!r}")
        self.client = client or connect(url)
        self.layout = Layout(self.client.database, raw_days, cluster)
        self._write_settings = dict(_WRITE_SETTINGS)
        if cluster:  # acknowledged once the shards have the rows, the token travelling with them
            self._write_settings["distributed_foreground_insert"] = 1
        self._hashes: dict[tuple[str, str], int] = {}  # (kind, name) -> key, for names already registered
        self._names: dict[tuple[str, int], str] = {}
        self.rollups_repaired = 0  # rollup rows repair_rollups inserted (benchmarks: did a kill need one?)

    # -- schema ---------------------------------------------------------------------------------

    def create(self) -> None:
        had = self._tables()
        backfill = "gpu_day_rollups" in had and "run_day_rollups" not in had
        if backfill:
            self._create_run_days()
        for sql in self.layout.statements():
            self.client.command(sql)
        # A store made before run_dims.dims: the column added (computed from the names on read).
        self.client.command(
            f"ALTER TABLE {self.layout.local('run_dims')}{self.layout.on()} ADD COLUMN IF NOT EXISTS "
            f"dims {dict(DIMS_COLUMNS)['dims']}"
        )
        self._add_seq_index()
        # A changed raw window: the TTL follows it (ALTER ... MODIFY TTL; whole parts are dropped).
        for name in ("gpu_intervals", "host_intervals", clickhouse_capacity.TABLE):
            engine = self.client.query(
                "SELECT engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
                {"db": self.layout.database, "t": self.layout.local_name(name)},
            )
            if engine and f"toIntervalDay({self.layout.raw_days})" not in engine[0][0]:
                self.client.command(
                    f"ALTER TABLE {self.layout.local(name)}{self.layout.on()} MODIFY TTL {self.layout.ttl()}",
                    {"mutations_sync": 2},
                )

    def _add_seq_index(self) -> None:
        """A store made before the raw tables' seq skip index (clickhouse_ddl.SEQ_INDEX): the index
        added, once (looked up first, so an open of an indexed store alters nothing). Metadata only:
        the engine indexes new parts and merged ones; older parts have none and a page reads them
        whole, as before, until a merge or the raw window's TTL replaces them (nothing is
        materialised here: that would read every stored seq at each open of an old store)."""
        names = [self.layout.local_name(n) for n in SEQ_INDEXED]
        have = self.client.query(
            "SELECT table FROM system.data_skipping_indices WHERE database = {db:String} "
            "AND table IN {t:Array(String)} AND name = {i:String}",
            {"db": self.layout.database, "t": names, "i": SEQ_INDEX[0]},
        )
        for name in SEQ_INDEXED:
            if [self.layout.local_name(name)] not in have:
                self.client.command(self.layout.seq_index(name))

    def _tables(self) -> set[str]:
        rows = self.client.query(
            "SELECT name FROM system.tables WHERE database = {db:String}", {"db": self.layout.database}
        )
        return {n.removesuffix("_local") if self.layout.cluster else n for (n,) in rows}

    def _create_run_days(self) -> None:
        """A store made before ``run_day_rollups``: the table and its view made, then filled from
        the parts of ``gpu_day_rollups`` that were there before the view (merges held meanwhile, so
        no part of those mixes with rows the view already counted)."""
        if self.layout.cluster:
            raise ClickHouseError(
                "this cluster's tables predate run_day_rollups: fill it on each shard as "
                "deploy/clickhouse/README.md says (not done here: a cluster does not run in the tests)"
            )
        rollups = self.layout.local("gpu_day_rollups")
        self.client.command(f"SYSTEM STOP MERGES {rollups}")
        try:
            parts = self.client.query(
                "SELECT name FROM system.parts WHERE database = {db:String} AND table = 'gpu_day_rollups' AND active",
                {"db": self.layout.database},
            )
            for sql in self.layout.run_day_statements():
                self.client.command(sql)
            if parts:
                before = "\nWHERE _part IN {p:Array(String)}\nGROUP BY"
                select = self.layout.run_day_select().replace("\nGROUP BY", before)
                self.client.query(
                    f"INSERT INTO {self.layout.local('run_day_rollups')} {select}", {"p": [p for (p,) in parts]}
                )
        finally:
            self.client.command(f"SYSTEM START MERGES {rollups}")

    # -- keys -----------------------------------------------------------------------------------

    def _keys(self, kind: str, names: Iterable[str]) -> dict[str, int]:
        """name -> its 64-bit key (the engine's ``cityHash64``, computed here: one statement less
        a new name), registered in series_names the first time this process meets it."""
        names = list(names)
        wanted = sorted({n for n in names if (kind, n) not in self._hashes})
        if wanted:
            found = {n: city_hash64(n) for n in wanted}
            self.client.insert(
                self.layout.table("series_names"),
                [{"kind": kind, "hash": h, "name": n} for n, h in found.items()],
                ("kind", "hash", "name"),
                {},
            )
            for n, h in found.items():
                self._hashes[(kind, n)] = h
                self._names[(kind, h)] = n
        return {n: self._hashes[(kind, n)] for n in names}

    def _key(self, kind: str, name: str) -> int:
        return self._keys(kind, [name])[name]

    def _decode(self, kind: str, hashes: Iterable[int]) -> dict[int, str]:
        hashes = list(hashes)
        missing = sorted({h for h in hashes if (kind, h) not in self._names})
        if missing:
            rows = self.client.query(
                f"SELECT hash, any(name) FROM {self.layout.table('series_names')} "
                "WHERE kind = {k:String} AND hash IN {h:Array(UInt64)} GROUP BY hash",
                {"k": kind, "h": missing},
            )
            for h, n in rows:
                self._names[(kind, int(h))] = n
        return {h: self._names.get((kind, h), f"unknown-{kind}-{h:016x}") for h in hashes}

    # -- writes ---------------------------------------------------------------------------------

    def write(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row], token: str) -> int:
        if not token:
            raise ValueError("a batch needs a token: the same token again stores nothing")
        for r in gpu:
            if not isinstance(r.get("device_uuid"), str) or not r["device_uuid"]:
                raise BadRow(f"run {run_id} GPU interval seq {r.get('seq')}: device_uuid is required")
        run = self._key("run", run_id)
        gpus = self._keys("gpu", (str(r.get("device_uuid")) for r in gpu))
        gpu_cols = gpu_columns(gpu, gpus, run, run_id) if gpu else None  # numpy, column by column
        host_rows = [host_row(r, run, f"run {run_id} host seq {r.get('seq')}") for r in host]
        # Rows of one UTC day make one block per table, stored or dropped whole: when the client
        # tells dropped blocks, that says what was stored; otherwise the rows are counted around
        # the inserts (two queries more).
        told = self.client.tells_duplicates and len(_days(gpu_cols)) <= 1 and len(_days(host_rows)) <= 1
        before = 0 if told else self._count(run, gpu_cols, host_rows)
        stored = self._insert(gpu_cols, host_rows, token)
        return stored if told else self._count(run, gpu_cols, host_rows) - before

    def _insert(self, gpu_cols: Mapping[str, Any] | None, host_rows: list[dict[str, Any]], token: str) -> int:
        """One insert per table with the batch's token (``:gpu``, ``:host``): the rows sent, 0 for a
        table whose insert the engine dropped whole as seen before."""
        stored = 0
        if gpu_cols:
            settings = {**self._write_settings, "insert_deduplication_token": f"{token}:gpu"}
            dropped = self.client.insert_columns(self.layout.table("gpu_intervals"), gpu_cols, settings)
            stored += len(gpu_cols["t0"]) if not dropped else 0
        if host_rows:
            settings = {**self._write_settings, "insert_deduplication_token": f"{token}:host"}
            dropped = self.client.insert(self.layout.table("host_intervals"), host_rows, HOST_INSERT, settings)
            stored += len(host_rows) if not dropped else 0
        return stored

    def write_group(self, batches: Sequence[tuple[str, Sequence[Row], Sequence[Row]]], token: str) -> int:
        """Several runs' batches ((run id, gpu rows, host rows) each) as ONE insert per table with
        ``token`` (a group commit, store/series_batch.py: the per-insert parts and views paid once).
        The rows sent, or 0 for a table whose insert the engine dropped whole as seen before; the
        caller leaves out the rows the store holds first (``held_group``), since another grouping
        of the same rows would carry another token."""
        if not token:
            raise ValueError("a batch needs a token: the same token again stores nothing")
        for run_id, gpu, _ in batches:
            for r in gpu:
                if not isinstance(r.get("device_uuid"), str) or not r["device_uuid"]:
                    raise BadRow(f"run {run_id} GPU interval seq {r.get('seq')}: device_uuid is required")
        runs = self._keys("run", (run_id for run_id, _, _ in batches))
        gpus = self._keys("gpu", (str(r["device_uuid"]) for _, gpu, _ in batches for r in gpu))
        gpu_cols: dict[str, list[Any]] = {}
        host_rows: list[dict[str, Any]] = []
        for run_id, gpu, host in batches:
            if gpu:  # numpy, column by column, per run (its key a column of its own)
                for c, values in gpu_columns(gpu, gpus, runs[run_id], run_id).items():
                    gpu_cols.setdefault(c, []).extend(values)
            host_rows += [host_row(r, runs[run_id], f"run {run_id} host seq {r.get('seq')}") for r in host]
        return self._insert(gpu_cols, host_rows, token)

    def held_group(
        self, batches: Sequence[tuple[str, Sequence[Row], Sequence[Row]]]
    ) -> list[tuple[set[tuple[str, int]], set[int]]]:
        """``held`` of many runs' batches (each run once) in one statement per table, per batch in order."""
        runs = self._keys("run", (run_id for run_id, _, _ in batches))  # new names: one statement per kind
        gpus = self._keys("gpu", {str(r["device_uuid"]) for _, gpu, _ in batches for r in gpu})
        keyed = [
            (runs[run_id], {str(r["device_uuid"]): gpus[str(r["device_uuid"])] for r in gpu}, gpu, host)
            for run_id, gpu, host in batches
        ]
        return held_group(self.client, self.layout.table, keyed)

    def repair_rollups(self, held: Sequence[tuple[str, Sequence[Row]]]) -> int:
        """(run id, GPU rows of it that ``held`` found in the store) of a push or a group: the
        rollups of those runs, GPUs and days made equal to their raw rows where a killed insert
        left them short (series/clickhouse_repair.py). The rollup rows inserted (0: all whole)."""
        runs = self._keys("run", (run_id for run_id, rows in held if rows))
        gpus = self._keys("gpu", {str(r["device_uuid"]) for _, rows in held for r in rows})
        by_stream: dict[tuple[int, int], list[Row]] = {}
        for run_id, rows in held:
            for r in rows:
                by_stream.setdefault((runs[run_id], gpus[str(r["device_uuid"])]), []).append(r)
        streams = {k: clickhouse_repair.days_reached(rows) for k, rows in by_stream.items()}
        n = clickhouse_repair.repair(self.client, self.layout.table, self._write_settings, streams)
        self.rollups_repaired += n
        return n

    def short_rollups(self, run_id: str, device_uuids: Iterable[str], day: date) -> list[str]:
        """One line per rollup of ``run_id`` on ``day`` short of its raw rows: per GPU of
        ``device_uuids`` its ``gpu_day_rollups`` against the view's SELECT over the raw rows, and
        the run's ``run_day_rollups`` against its GPU rollups (series/clickhouse_repair.short).
        Read only (the keys hashed here, no name registered); [] when they are whole."""
        names = {city_hash64(u): u for u in set(device_uuids)}
        n = (day - clickhouse_repair.EPOCH).days
        streams = {(city_hash64(run_id), k): (n, n) for k in names}
        out = []
        for _, gpu, on, how in clickhouse_repair.short(self.client, self.layout.table, streams):
            what = f"GPU {names.get(gpu, gpu)} day rollup" if gpu is not None else "run × day rollup (chargeback)"
            out.append(f"{what} of {on.isoformat()} short of its raw rows: {how}")
        return out

    def _count(self, run: int, gpu_cols: dict[str, list[Any]] | None, host_rows: list[dict[str, Any]]) -> int:
        """Rows stored in the key ranges of a batch (by key: no scan): the difference before and
        after an insert is what it stored, a resent batch's 0. (The engine does not say whether
        it dropped a block; another writer of the same run and times at the same moment would
        shift the figure, never the rows.)"""
        n = 0
        if gpu_cols:
            n += self.client.query(
                f"SELECT count() FROM {self.layout.table('gpu_intervals')} WHERE gpu IN {{g:Array(UInt64)}} "
                "AND t0 >= toDateTime64({a:String}, 3, 'UTC') AND t0 <= toDateTime64({b:String}, 3, 'UTC') "
                "AND run = {r:UInt64}",
                {"g": sorted(set(gpu_cols["gpu"])), "r": run, **_t0_range(gpu_cols["t0"])},
            )[0][0]
        if host_rows:
            n += self.client.query(
                f"SELECT count() FROM {self.layout.table('host_intervals')} WHERE run = {{r:UInt64}} "
                "AND t0 >= toDateTime64({a:String}, 3, 'UTC') AND t0 <= toDateTime64({b:String}, 3, 'UTC')",
                {"r": run, **_t0_range([r["t0"] for r in host_rows])},
            )[0][0]
        return int(n)

    def write_capacity(self, rows: Sequence[Row], token: str) -> int:
        """Store capacity intervals (``gpu_capacity`` rows: series/capacity.py) once, leaving out
        those the store holds (by key) and with ``token`` as the insert's dedup token. The rows
        stored."""
        if not token:
            raise ValueError("a batch needs a token: the same token again stores nothing")
        for r in rows:  # every row checked before anything is stored
            capacity.checked(r)
        keys = self._keys("gpu", {str(r["gpu_uuid"]) for r in rows})
        new = clickhouse_capacity.unheld(self.client, self.layout.table, clickhouse_capacity.to_rows(rows, keys))
        if not new:
            return 0
        settings = {**self._write_settings, "insert_deduplication_token": f"{token}:capacity"}
        table = self.layout.table(clickhouse_capacity.TABLE)
        dropped = self.client.insert(table, new, clickhouse_capacity.INSERT, settings)
        if dropped is not None and len(clickhouse_capacity.days(new)) <= 1:  # one block: stored or dropped whole
            return 0 if dropped else len(new)
        return len(new) - len(clickhouse_capacity.unheld(self.client, self.layout.table, new))

    def capacity_intervals(self, gpu_uuids: Sequence[str], t_from_ms: int, t_to_ms: int) -> list[dict[str, Any]]:
        """The capacity intervals of ``gpu_uuids`` starting in [t_from_ms, t_to_ms), in (GPU,
        start) order, by the (gpu, t0) key."""
        return clickhouse_capacity.read(self.client, self.layout.table, gpu_uuids, t_from_ms, t_to_ms)

    # -- reads ----------------------------------------------------------------------------------

    def gpu_intervals(self, run_id: str, device_uuid: str | None = None) -> list[dict[str, Any]]:
        """One run's GPU intervals by key: the run's GPUs and days from its rollup rows, then
        (gpu, t0) ranges of the raw table; in (device, seq) order."""
        run = self._key("run", run_id)
        spans = self.client.query(
            f"SELECT gpu, min(day), max(day) FROM {self.layout.table('gpu_day_rollups')} "
            "WHERE run = {r:UInt64} GROUP BY gpu",
            {"r": run},
        )
        if device_uuid is not None:
            only = self._key("gpu", device_uuid)
            spans = [s for s in spans if int(s[0]) == only]
        if not spans:
            return []
        names = self._decode("gpu", (int(s[0]) for s in spans))
        out: list[dict[str, Any]] = []
        for gpu, first, last in spans:
            rows = self.client.query(
                f"SELECT {', '.join(GPU_SELECT)} FROM {self.layout.table('gpu_intervals')} "
                "WHERE gpu = {g:UInt64} AND t0 >= toDateTime64({a:String}, 3, 'UTC') "
                "AND t0 < toDateTime64({b:String}, 3, 'UTC') + INTERVAL 1 DAY AND run = {r:UInt64} ORDER BY seq",
                {"g": int(gpu), "a": first, "b": last, "r": run},
            )
            out += [gpu_back(names[int(gpu)], r) for r in rows]
        out.sort(key=lambda r: (r["device_uuid"], r["seq"]))
        return out

    def gpu_devices(self, run_id: str) -> list[str]:
        """The UUIDs of the GPUs the store holds rows of the run for, sorted."""
        spans = clickhouse_pages.gpu_spans(self.client, self.layout.table, self._key("run", run_id))
        return sorted(self._decode("gpu", (int(s[0]) for s in spans)).values())

    def gpu_page(self, run_id: str, device_uuid: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """The run's rows of the GPU with seq > ``after_seq`` in seq order: ``limit`` and those tied
        with the last (series/clickhouse_pages.py)."""
        run, gpu = self._key("run", run_id), self._key("gpu", device_uuid)
        return clickhouse_pages.gpu_page(self.client, self.layout.table, run, gpu, device_uuid, after_seq, limit)

    def host_page(self, run_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """The run's host rows with seq > ``after_seq`` in seq order, as ``gpu_page``."""
        return clickhouse_pages.host_page(self.client, self.layout.table, self._key("run", run_id), after_seq, limit)

    def held(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> tuple[set[tuple[str, int]], set[int]]:
        """The (device, seq) of the batch's ``gpu`` rows and the seqs of its ``host`` rows that the
        store already holds for ``run_id`` (other runs' rows at the same GPU and times are not
        counted), read by key (series/clickhouse_keyed.py): there is no unique key to drop them on."""
        gpus = self._keys("gpu", {str(r["device_uuid"]) for r in gpu})
        return held(self.client, self.layout.table, self._key("run", run_id), gpus, gpu, host)

    def gpu_intervals_between(self, run_id: str, t_from: float, t_to: float) -> list[dict[str, Any]]:
        """The run's GPU intervals with t1 > ``t_from`` and t0 < ``t_to`` (seconds), in (device, seq)
        order, by each GPU's (gpu, t0) key range (series/clickhouse_keyed.py), not the whole run."""
        run = self._key("run", run_id)
        spans = self.client.query(
            f"SELECT gpu, min(day), max(day) FROM {self.layout.table('gpu_day_rollups')} "
            "WHERE run = {r:UInt64} GROUP BY gpu",
            {"r": run},
        )
        names = self._decode("gpu", (int(s[0]) for s in spans))
        return gpu_between(self.client, self.layout.table, run, spans, names, t_from, t_to)

    def host_intervals_between(self, run_id: str, t_from: float, t_to: float) -> list[dict[str, Any]]:
        """The run's host intervals with t1 > ``t_from`` and t0 < ``t_to``, in seq order."""
        return host_between(self.client, self.layout.table, self._key("run", run_id), t_from, t_to)

    def host_intervals(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.client.query(
            f"SELECT {', '.join(HOST_SELECT)} FROM {self.layout.table('host_intervals')} WHERE run = {{r:UInt64}} "
            "ORDER BY seq",
            {"r": self._key("run", run_id)},
        )
        return [host_back(r) for r in rows]

    def day_rollups(self, t_from: float, t_to: float) -> list[DayRollup]:
        first = date(1970, 1, 1) + timedelta(days=int(t_from // DAY_S))
        last = date(1970, 1, 1) + timedelta(days=int(-(-t_to // DAY_S)) - 1)
        if last < first:
            return []
        sums = ", ".join(f"sum({c})" for c in ROLLUP_SUMS)
        rows = self.client.query(
            f"SELECT run, gpu, day, {sums} FROM {self.layout.table('gpu_day_rollups')} "
            "WHERE day >= {a:Date} AND day <= {b:Date} GROUP BY run, gpu, day",
            {"a": first.isoformat(), "b": last.isoformat()},
        )
        runs = self._decode("run", (int(r[0]) for r in rows))
        gpus = self._decode("gpu", (int(r[1]) for r in rows))
        out = []
        for run, gpu, day, *v in rows:
            s = dict(zip(ROLLUP_SUMS, (int(x) for x in v), strict=True))

            def measured(col: str, s: dict[str, int] = s) -> float | None:
                return s[f"{col}_ms"] / 1000 if s[f"{col}_n"] else None

            out.append(
                DayRollup(
                    run_id=runs[int(run)],
                    device_uuid=gpus[int(gpu)],
                    day=date.fromisoformat(day),
                    intervals=s["intervals"],
                    samples=s["samples"],
                    allocated_s=s["allocated_ms"] / 1000,
                    busy_s=measured("busy"),
                    idle_s=measured("idle"),
                    unknown_s=measured("unknown"),
                    unmeasured_s=measured("unmeasured"),
                    energy_j=s["energy_mj"] / 1000 if s["energy_n"] else None,
                )
            )
        out.sort(key=lambda r: (r.run_id, r.device_uuid, r.day))
        return out

    # -- chargeback from the rollups ------------------------------------------------------------

    def put_runs(self, runs: Iterable[tuple[str, str, str, str]], version_ms: int) -> None:
        """(run id, team, project, user) of runs into ``run_dims``, as the server learns or
        relabels them; for a run put twice, the higher ``version_ms`` wins."""
        rows = [dict(zip(("run_id", "team", "project", "user"), r, strict=True)) for r in runs]
        keys = self._keys("run", (r["run_id"] for r in rows))
        for r in rows:
            r.update(run=keys[r["run_id"]], version=int(version_ms))
        columns = ("run", "run_id", "team", "project", "user", "version")
        self.client.insert(self.layout.table("run_dims"), rows, columns, {})

    def monthly_chargeback(self, first: date, last: date) -> list[tuple[str, str, str, date, int, int, int]]:
        """(team, project, user, month, allocated ms, busy ms, energy mJ) of the rollups of the
        days ``first``..``last``, from the rollups alone (no raw row is read). A run without
        ``run_dims`` falls under team, project and user ''."""
        # From run_day_rollups (one row per run and day, not per run, GPU and day), joined to each
        # run's newest team x project x user as one integer, grouped by it and the month, and only
        # then the few groups named: a year of 100,000 GPUs in 1-3 s on 2 cores, not 10-20 s.
        rows = self.client.query(
            "SELECT n.team, n.project, n.user, g.month, sum(g.a), sum(g.b), sum(g.e) "
            "FROM (SELECT d.dims AS dims, toStartOfMonth(r.day) AS month, sum(r.allocated_ms) AS a, "
            f"sum(r.busy_ms) AS b, sum(r.energy_mj) AS e FROM {self.layout.table('run_day_rollups')} AS r "
            f"LEFT JOIN (SELECT run, dims FROM {self.layout.local('run_dims')} FINAL) AS d ON r.run = d.run "
            "WHERE r.day >= {a:Date} AND r.day <= {b:Date} GROUP BY dims, month) AS g "
            "LEFT JOIN (SELECT dims, any(team) AS team, any(project) AS project, any(user) AS user "
            f"FROM {self.layout.local('run_dims')} GROUP BY dims) AS n ON g.dims = n.dims "
            "GROUP BY n.team, n.project, n.user, g.month "
            "ORDER BY n.team, n.project, n.user, g.month SETTINGS join_algorithm = 'hash'",
            {"a": first.isoformat(), "b": last.isoformat()},
        )
        return [(t, p, u, date.fromisoformat(m), int(a), int(b), int(e)) for t, p, u, m, a, b, e in rows]

    # -- retention and size ---------------------------------------------------------------------

    def drop_days_before(self, day: date) -> int:
        """Drop each raw day before ``day`` with ALTER TABLE ... DROP PARTITION (no row DELETE);
        the rollups stay. The number of days dropped."""
        dropped: set[str] = set()
        for name in ("gpu_intervals", "host_intervals", clickhouse_capacity.TABLE):
            parts = self.client.query(
                f"SELECT DISTINCT partition_id FROM {self.layout.parts()} WHERE database = {{db:String}} "
                "AND table = {t:String} AND active AND partition_id < {d:String}",
                {"db": self.layout.database, "t": self.layout.local_name(name), "d": day.strftime("%Y%m%d")},
            )
            for (pid,) in parts:
                self.client.command(
                    f"ALTER TABLE {self.layout.local(name)}{self.layout.on()} DROP PARTITION ID '{pid}'"
                )
                dropped.add(pid)
        return len(dropped)

    def raw_days(self) -> list[date]:
        """The UTC days that still have raw GPU intervals."""
        rows = self.client.query(
            f"SELECT DISTINCT toDate(t0) AS d FROM {self.layout.table('gpu_intervals')} ORDER BY d"
        )
        return [date.fromisoformat(d) for (d,) in rows]

    def expire(self) -> None:
        """Apply the raw window now (the engine otherwise drops expired parts in the background)."""
        for name in ("gpu_intervals", "host_intervals", clickhouse_capacity.TABLE):
            sql = f"ALTER TABLE {self.layout.local(name)}{self.layout.on()} MATERIALIZE TTL"
            self.client.command(sql, {"mutations_sync": 2})

    def compact(self) -> None:
        """Merge each table's parts as the engine does in the background (benchmarks, before measuring)."""
        tables = ("gpu_intervals", "host_intervals", clickhouse_capacity.TABLE, "gpu_day_rollups", "run_day_rollups")
        for name in tables:
            self.client.command(f"OPTIMIZE TABLE {self.layout.local(name)}{self.layout.on()} FINAL")

    def bytes_at_rest(self) -> int:
        """Of the GPU intervals' active parts (on a cluster: every replica's, so replication counts)."""
        rows = self.client.query(
            f"SELECT sum(bytes_on_disk) FROM {self.layout.parts()} WHERE database = {{db:String}} "
            "AND table = {t:String} AND active",
            {"db": self.layout.database, "t": self.layout.local_name("gpu_intervals")},
        )
        return int(rows[0][0]) if rows else 0

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> ClickHouseSeries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
