"""Small integer keys for names (GPU UUIDs, run ids, (run, GPU) streams, row shapes), allocated
race-free: several server processes may meet a new GPU at once and must get the same key.

Each allocation is its own short transaction: read what exists, ``INSERT ... ON CONFLICT DO
NOTHING RETURNING`` the rest, read again what another writer inserted meanwhile (its commit is
what our insert waited for, and READ COMMITTED shows it to the next statement). Keys are cached
per store: they never change once given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from gpuledger.series.postgres_codec import Shape


class Keys:
    def __init__(self, conn: psycopg.Connection, schema: str) -> None:
        self._conn, self._s = conn, schema
        self.gpus: dict[str, int] = {}
        self.runs: dict[str, int] = {}
        self.hosts: dict[str, int] = {}
        self.streams: dict[tuple[int, int], tuple[int, int | None]] = {}  # (run, gpu) -> (key, mem_reserved_b)
        self.shapes: dict[Shape, int] = {}
        self.shape_of: dict[int, Shape] = {}

    def _names(self, table: str, column: str, names: Iterable[str], cache: dict[str, int]) -> dict[str, int]:
        names = set(names)
        missing = sorted(names - set(cache))
        if missing:
            q = f"SELECT {column}, key FROM {self._s}.{table} WHERE {column} = ANY(%s)"
            ins = (
                f"INSERT INTO {self._s}.{table} ({column}) SELECT unnest(%s::text[]) "
                f"ON CONFLICT ({column}) DO NOTHING RETURNING {column}, key"
            )
            with self._conn.transaction():
                cache.update(self._conn.execute(q, (missing,)).fetchall())
                new = [n for n in missing if n not in cache]
                if new:
                    cache.update(self._conn.execute(ins, (new,)).fetchall())
                    cache.update(self._conn.execute(q, ([n for n in new if n not in cache],)).fetchall())
        return {n: cache[n] for n in names}

    def gpu_keys(self, uuids: Iterable[str]) -> dict[str, int]:
        return self._names("gpu_keys", "uuid", uuids, self.gpus)

    def host_keys(self, hosts: Iterable[str]) -> dict[str, int]:
        return self._names("host_keys", "host", hosts, self.hosts)

    def names(self, table: str, column: str, keys: Iterable[int]) -> dict[int, str]:
        """key -> name of ``keys`` in ``table`` (gpu_keys.uuid, host_keys.host, run_keys.run_id)."""
        q = f"SELECT key, {column} FROM {self._s}.{table} WHERE key = ANY(%s)"
        return dict(self._conn.execute(q, (sorted(set(keys)),)).fetchall())

    def run_key(self, run_id: str, create: bool = True) -> int | None:
        if run_id not in self.runs and not create:
            row = self._conn.execute(f"SELECT key FROM {self._s}.run_keys WHERE run_id = %s", (run_id,)).fetchone()
            return None if row is None else row[0]
        return self._names("run_keys", "run_id", [run_id], self.runs)[run_id]

    def stream_keys(self, run: int, gpus: dict[int, int | None]) -> dict[int, tuple[int, int | None]]:
        """(run, gpu) -> (stream key, the stream's mem_reserved_b); ``gpus``: gpu -> the
        mem_reserved_b the stream takes if it is new (the first writer's value wins)."""
        missing = sorted(g for g in gpus if (run, g) not in self.streams)
        if missing:
            q = f"SELECT gpu, key, mem_reserved_b FROM {self._s}.streams WHERE run = %s AND gpu = ANY(%s)"
            ins = (
                f"INSERT INTO {self._s}.streams (run, gpu, mem_reserved_b) "
                "SELECT %s, unnest(%s::int4[]), unnest(%s::int8[]) ON CONFLICT (run, gpu) DO NOTHING"
            )
            with self._conn.transaction():
                self._conn.execute(ins, (run, missing, [gpus[g] for g in missing]))
                for gpu, key, reserved in self._conn.execute(q, (run, missing)):
                    self.streams[(run, gpu)] = (key, reserved)
        return {g: self.streams[(run, g)] for g in gpus}

    def run_streams(self, run: int) -> list[tuple[int, str, int | None]]:
        """Every stream of a run: (stream key, GPU UUID, mem_reserved_b)."""
        q = (
            f"SELECT s.key, g.uuid, s.mem_reserved_b FROM {self._s}.streams s JOIN {self._s}.gpu_keys g "
            "ON g.key = s.gpu WHERE s.run = %s"
        )
        return list(self._conn.execute(q, (run,)))

    def shape_codes(self, shapes: Iterable[Shape]) -> dict[Shape, int]:
        missing = [s for s in dict.fromkeys(shapes) if s not in self.shapes]
        ins = (
            f"INSERT INTO {self._s}.shapes ({_SHAPE_COLS}) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT DO NOTHING RETURNING code"
        )
        for shape in missing:
            values: tuple[Any, ...] = (*_fields(shape),)
            with self._conn.transaction():
                row = self._conn.execute(ins, values).fetchone()
                if row is None:  # another writer's: NULLS NOT DISTINCT made it conflict
                    row = self._conn.execute(
                        f"SELECT code FROM {self._s}.shapes WHERE util_method IS NOT DISTINCT FROM %s AND "
                        "energy_method IS NOT DISTINCT FROM %s AND proc_method IS NOT DISTINCT FROM %s AND "
                        "nulls = %s AND throttle IS NOT DISTINCT FROM %s::text[]",
                        values,
                    ).fetchone()
            assert row is not None
            self.shapes[shape] = row[0]
            self.shape_of[row[0]] = shape
        return self.shapes

    def shape(self, code: int) -> Shape:
        if code not in self.shape_of:
            for c, u, e, p, nulls, thr in self._conn.execute(f"SELECT code, {_SHAPE_COLS} FROM {self._s}.shapes"):
                shape = Shape(u, e, p, nulls, None if thr is None else tuple(thr))
                self.shape_of[c], self.shapes[shape] = shape, c
        return self.shape_of[code]


_SHAPE_COLS = "util_method, energy_method, proc_method, nulls, throttle"


def _fields(shape: Shape) -> tuple[Any, ...]:
    thr = None if shape.throttle is None else list(shape.throttle)
    return (shape.util_method, shape.energy_method, shape.proc_method, shape.nulls, thr)
