"""Capacity intervals in the compact PostgreSQL store (series/capacity.py): rows of ``cap_iv``
(series/postgres_ddl.py), one day partition per UTC day of the interval's start, keyed (gpu, t_ms).

A row is 4-byte GPU and host keys (``gpu_keys``, ``host_keys``), the start as its day and ms into
the day, the span, the five states in ms (NULL for 0) and the energy in mJ. Reads go by key: the
GPUs' keys, then ``gpu = ANY(...)`` in the days asked for, an index scan of each day's key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import psycopg

from gpuledger.series import capacity
from gpuledger.series.capacity import DAY_MS, BadCapacityRow, Row
from gpuledger.series.postgres_codec import INT2
from gpuledger.series.postgres_ddl import CAP_COLUMNS, CAP_STATES
from gpuledger.series.postgres_keys import Keys
from gpuledger.series.quantum import from_units

_NAMES = tuple(c for c, _ in CAP_COLUMNS)


class Parsed(NamedTuple):
    gpu_uuid: str
    host: str
    day: int
    t_ms: int
    dur_ms: int
    states: list[int]
    energy_mj: int | None


def parse(rows: Sequence[Row]) -> list[Parsed]:
    """Every row checked (BadCapacityRow names the first that does not fit), once per key."""
    out = []
    for r in capacity.by_key(rows):
        t0, dur, states, energy = capacity.checked(r)
        day = t0 // DAY_MS
        if not INT2[0] <= day < INT2[1]:
            where = f"capacity interval of GPU {r['gpu_uuid']!r} at {t0}"
            raise BadCapacityRow(f"{where}: a day the store has no partition for")
        out.append(Parsed(str(r["gpu_uuid"]), str(r["host"]), day, t0 - day * DAY_MS, dur, states, energy))
    return out


def keyed(parsed: Sequence[Parsed], keys: Keys) -> list[tuple[Any, ...]]:
    """The rows in ``cap_iv`` column order, with their GPU and host keys (allocated where new)."""
    gpus = keys.gpu_keys(p.gpu_uuid for p in parsed)
    hosts = keys.host_keys(p.host for p in parsed)
    out = []
    for p in parsed:
        values = {
            "energy_mj": p.energy_mj, "gpu": gpus[p.gpu_uuid], "host": hosts[p.host], "t_ms": p.t_ms,
            "dur_ms": p.dur_ms, "day": p.day, **{c: v or None for c, v in zip(CAP_STATES, p.states, strict=True)},
        }  # fmt: skip
        out.append(tuple(values[c] for c in _NAMES))
    return out


def read(
    conn: psycopg.Connection, schema: str, keys: Keys, gpu_uuids: Sequence[str], t_from_ms: int, t_to_ms: int
) -> list[dict[str, Any]]:
    """The stored intervals of ``gpu_uuids`` starting in [t_from_ms, t_to_ms), in (GPU, start)
    order, as series/capacity.quantize of what was written."""
    if not gpu_uuids or t_to_ms <= t_from_ms:
        return []
    found = conn.execute(f"SELECT key, uuid FROM {schema}.gpu_keys WHERE uuid = ANY(%s)", (sorted(set(gpu_uuids)),))
    gpus = dict(found.fetchall())
    if not gpus:
        return []
    lo, hi = max(t_from_ms // DAY_MS, INT2[0]), min((t_to_ms - 1) // DAY_MS, INT2[1] - 1)
    start = f"(day::int8 * {DAY_MS} + t_ms)"
    q = (
        f"SELECT {', '.join(_NAMES)} FROM {schema}.cap_iv WHERE gpu = ANY(%s) AND day BETWEEN %s AND %s "
        f"AND {start} >= %s AND {start} < %s"
    )
    rows = conn.execute(q, (list(gpus), lo, hi, t_from_ms, t_to_ms)).fetchall()
    hosts = keys.names("host_keys", "host", (r[_NAMES.index("host")] for r in rows))
    out = []
    for r in rows:
        v = dict(zip(_NAMES, r, strict=True))
        t0 = v["day"] * DAY_MS + v["t_ms"]
        out.append({
            "gpu_uuid": gpus[v["gpu"]], "host": hosts[v["host"]], "t0_ms": t0, "t1_ms": t0 + v["dur_ms"],
            **{c: v[c] or 0 for c in CAP_STATES},
            "energy_j": from_units(v["energy_mj"], capacity.ENERGY_SCALE),
        })  # fmt: skip
    out.sort(key=lambda r: (r["gpu_uuid"], r["t0_ms"]))
    return out
