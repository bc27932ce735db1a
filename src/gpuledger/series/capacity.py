"""Capacity intervals in a series store (docs/SCALE.md, issue 38): the node agent's per GPU and
agent interval split into the four states (core/capacity/model.py), kept as the ledger keeps them
in ``gpu_capacity`` but compact, by the stores of series/postgres.py and series/clickhouse.py.

A row goes in and comes back as a dict of the ledger's ``gpu_capacity`` columns (``COLUMNS``):
times and states are integer milliseconds already, so only the energy is rounded, to whole mJ
(``quantize``). Its identity is the ledger's, (GPU, start): a row stored again is dropped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from gpuledger.series.quantum import from_units, to_units

Row = Mapping[str, Any]

STATES = ("unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms", "unmeasured_ms")
COLUMNS = ("gpu_uuid", "host", "t0_ms", "t1_ms", *STATES, "energy_j")
ENERGY_SCALE = 1000  # mJ
DAY_MS = 86_400_000
MAX_MS = 2**31 - 1  # a state or span in int4 ms (24.8 days; an agent's interval is seconds)
MAX_TOKEN = 200


class BadCapacityRow(ValueError):
    """A capacity interval a store cannot keep as given (its batch is refused whole)."""


def quantize(row: Row) -> dict[str, Any]:
    """A ``gpu_capacity`` row as a series store returns it: the energy in whole mJ."""
    out = {c: row.get(c) for c in COLUMNS}
    out["energy_j"] = from_units(to_units(out["energy_j"], ENERGY_SCALE), ENERGY_SCALE)
    return out


def checked(row: Row) -> tuple[int, int, list[int], int | None]:
    """(t0 ms, span ms, the five state ms, energy mJ or None) of a row, or BadCapacityRow."""
    where = f"capacity interval of GPU {row.get('gpu_uuid')!r} at {row.get('t0_ms')!r}"
    for name in ("gpu_uuid", "host"):
        if not isinstance(row.get(name), str) or not row[name]:
            raise BadCapacityRow(f"{where}: {name} is required")
    values = [row.get(c) for c in ("t0_ms", "t1_ms", *STATES)]
    if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
        raise BadCapacityRow(f"{where}: times and states are whole non-negative milliseconds")
    t0, t1, *states = values
    if not 0 <= t1 - t0 <= MAX_MS or max(states) > MAX_MS:
        raise BadCapacityRow(f"{where}: a span of {t1 - t0} ms does not fit the store (at most {MAX_MS})")
    try:
        energy = to_units(row.get("energy_j"), ENERGY_SCALE)
    except (TypeError, ValueError, OverflowError) as e:
        raise BadCapacityRow(f"{where}: energy_j = {row.get('energy_j')!r} is not a number") from e
    if energy is not None and not 0 <= energy < 2**63:
        raise BadCapacityRow(f"{where}: energy_j = {row.get('energy_j')!r} is out of range")
    return t0, t1 - t0, states, energy


def token(rows: Sequence[Row]) -> str:
    """``capacity:<gpu>:<first t0>-<last t0>,...`` of a batch (hashed past MAX_TOKEN characters):
    the same rows give the same token, so a batch stored before stores nothing again."""
    spans: dict[str, list[int]] = {}
    for r in rows:
        s = spans.setdefault(str(r["gpu_uuid"]), [int(r["t0_ms"]), int(r["t0_ms"])])
        s[0], s[1] = min(s[0], int(r["t0_ms"])), max(s[1], int(r["t0_ms"]))
    text = "capacity:" + ",".join(f"{g}:{a}-{b}" for g, (a, b) in sorted(spans.items()))
    if len(text) <= MAX_TOKEN:
        return text
    return f"capacity:sha256:{hashlib.sha256(text.encode()).hexdigest()}"


def by_key(rows: Sequence[Row]) -> list[Row]:
    """The rows once per (GPU, start), the first of each (the ledger's key), in key order."""
    seen: dict[tuple[str, int], Row] = {}
    for r in rows:
        seen.setdefault((str(r["gpu_uuid"]), int(r["t0_ms"])), r)
    return [seen[k] for k in sorted(seen)]
