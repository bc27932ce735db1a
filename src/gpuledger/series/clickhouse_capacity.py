"""Capacity intervals in the ClickHouse store (series/capacity.py): ``capacity_intervals`` of
series/clickhouse_ddl.py, ``ORDER BY (gpu, t0)``, a partition per UTC day, the raw window's TTL.

A batch is one INSERT with its token, as the GPU intervals are. ClickHouse has no unique key, so
the rows it already holds (stored by a write whose ledger transaction then failed, and sent again
in another batch) are looked up by key, the batch's (gpu, t0) range, and left out first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuledger.series import capacity
from gpuledger.series.capacity import Row
from gpuledger.series.clickhouse_client import Client
from gpuledger.series.clickhouse_ddl import CAPACITY_STATES
from gpuledger.series.clickhouse_hash import city_hash64
from gpuledger.series.clickhouse_keyed import LAST_MS
from gpuledger.series.quantum import from_units

TABLE = "capacity_intervals"
INSERT = ("gpu", "t0", "dur_ms", "host", *CAPACITY_STATES, "energy_mj")
SELECT = ("gpu", "host", "toUnixTimestamp64Milli(t0)", "dur_ms", *CAPACITY_STATES, "energy_mj")
_IN = "gpu IN {g:Array(UInt64)} AND t0 >= fromUnixTimestamp64Milli({a:Int64}, 'UTC') AND "


def to_rows(rows: Sequence[Row], keys: Mapping[str, int]) -> list[dict[str, Any]]:
    """Ledger ``gpu_capacity`` rows (checked: BadCapacityRow) as rows of ``capacity_intervals``,
    once per key; ``keys``: GPU UUID -> its 64-bit key."""
    out = []
    for r in capacity.by_key(rows):
        t0, dur, states, energy = capacity.checked(r)
        out.append({
            "gpu": keys[str(r["gpu_uuid"])], "t0": f"{t0 // 1000}.{t0 % 1000:03d}", "dur_ms": dur,
            "host": str(r["host"]), **dict(zip(CAPACITY_STATES, states, strict=True)), "energy_mj": energy,
        })  # fmt: skip
    return out


def _t0_ms(row: Mapping[str, Any]) -> int:
    sec, _, ms = str(row["t0"]).partition(".")
    return int(sec) * 1000 + int(ms)


def held(client: Client, table: Callable[[str], str], rows: Sequence[Mapping[str, Any]]) -> set[tuple[int, int]]:
    """The (gpu key, t0 ms) of ``rows`` (to_rows) the store holds already, read by key."""
    if not rows:
        return set()
    times = [_t0_ms(r) for r in rows]
    found = client.query(
        f"SELECT gpu, toUnixTimestamp64Milli(t0) FROM {table(TABLE)} WHERE {_IN}"
        "t0 <= fromUnixTimestamp64Milli({b:Int64}, 'UTC')",
        {"g": sorted({int(r["gpu"]) for r in rows}), "a": min(times), "b": max(times)},
    )
    return {(int(g), int(t)) for g, t in found}


def unheld(client: Client, table: Callable[[str], str], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    have = held(client, table, rows)
    return [r for r in rows if (int(r["gpu"]), _t0_ms(r)) not in have]


def days(rows: Sequence[Mapping[str, Any]]) -> set[int]:
    return {_t0_ms(r) // capacity.DAY_MS for r in rows}


def read(
    client: Client, table: Callable[[str], str], gpu_uuids: Sequence[str], t_from_ms: int, t_to_ms: int
) -> list[dict[str, Any]]:
    """The intervals of ``gpu_uuids`` starting in [t_from_ms, t_to_ms), by the (gpu, t0) key, in
    (GPU, start) order, as series/capacity.quantize of what was written."""
    if not gpu_uuids or t_to_ms <= t_from_ms:
        return []
    names = {city_hash64(u): u for u in set(gpu_uuids)}
    found = client.query(
        f"SELECT {', '.join(SELECT)} FROM {table(TABLE)} WHERE {_IN}t0 < fromUnixTimestamp64Milli({{b:Int64}}, 'UTC')",
        {"g": sorted(names), "a": max(t_from_ms, 0), "b": min(t_to_ms, LAST_MS)},
    )
    out = []
    for gpu, host, t0, dur, *rest in found:
        states, energy = rest[: len(CAPACITY_STATES)], rest[-1]
        out.append({
            "gpu_uuid": names[int(gpu)], "host": host, "t0_ms": int(t0), "t1_ms": int(t0) + int(dur),
            **{c: int(v) for c, v in zip(CAPACITY_STATES, states, strict=True)},
            "energy_j": from_units(None if energy is None else int(energy), capacity.ENERGY_SCALE),
        })  # fmt: skip
    out.sort(key=lambda r: (r["gpu_uuid"], r["t0_ms"]))
    return out
