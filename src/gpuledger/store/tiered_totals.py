"""A run's interval sums when some of its raw days were tiered into a series store and dropped
(store/series_tier.py), without reading the store: the ``run.raw_tiered`` entries' per-stream sums
(checked against the store when they were tiered, and by ``audit verify --series``) of the seq
ranges the ledger no longer holds (``rollup_marks`` at the dropped level), added to the sums of
the rows it still holds; a day the store itself has since dropped past its window
(``series.days_dropped``, store/series_window.py) is gone, as a read of the store finds it.
For ``gpuledger runs``, a report's earlier runs and ``show``'s attempts, which read many runs and
need a few sums per run, not its rows; ``dropped_gpu_sums`` reads a whole list of runs (the team
server's run list) in three queries, and ``dropped_parts`` gives the days' summaries as they are (the server's
``/metrics`` counters, in the store's integer units). Only the counted columns the entries sum are added (rows,
samples, busy, energy; CPU, read and write bytes), to the store's units; a column none of a day's
rows measured adds nothing, so a run never measured stays None (n/a), not 0. Entries tiered before
the summary counted measured rows (no ``measured``) add their sums as they are.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import schema, series_window
from gpuledger.store.partitions import DROPPED_LEVEL
from gpuledger.store.series_tier import ACTION, GPU_SUMS, HOST_SUMS

if TYPE_CHECKING:
    from gpuledger.store import Ledger

_HOST = ""  # the device_uuid of the host stream's rollup mark


def gpu_sums(
    ledger: Ledger, run_id: str, series_only: dict[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """``Ledger.gpu_totals`` with the tiered and dropped days' count, samples, busy_s and energy_j
    added when the ledger reads a series store (``Ledger.tiered``), and a series-only run's
    ``series_day_sums`` (with or without the store: the ledger holds them). ``series_only``: those
    sums of the run, read already for a whole list (``series_only_gpu_sums``)."""
    out = ledger.gpu_totals(run_id)
    if series_only is None:
        series_only = ledger.series_only_sums(run_id)  # not ledger.read: the server's scoped view
    for uuid, part in series_only.items():
        _merge(out.setdefault(uuid, {"count": 0}), part)
    if not ledger.tiered(run_id):
        return out
    marks, payloads = ledger.tiered_dropped(run_id)
    for uuid, part in _parts(payloads, marks, "gpu"):
        _add(out.setdefault(uuid, {"count": 0}), part, GPU_SUMS)
    return dict(sorted(out.items()))


def host_sums(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """``Ledger.host_totals`` with the tiered and dropped days' count, samples, cpu_s, read_b and
    write_b added when the ledger reads a series store."""
    out = ledger.host_totals(run_id)
    if not ledger.tiered(run_id):
        return out
    marks, payloads = ledger.tiered_dropped(run_id)
    for _, part in _parts(payloads, marks, "host"):
        _add(out, part, HOST_SUMS)
    return out


def gpu_busy(
    ledger: Ledger, run_id: str, series_only: dict[str, dict[str, Any]] | None = None
) -> dict[str, float | None]:
    """Per device uuid, the run's busy seconds (None where nothing measured it); ``series_only``
    as ``gpu_sums`` takes it."""
    return {uuid: t.get("busy_s") for uuid, t in gpu_sums(ledger, run_id, series_only).items()}


def expired(ledger: Ledger, run_id: str) -> bool:
    """Whether the store has dropped a tiered day of the run past its window: its reads miss it."""
    return any(p["expired"] for p in ledger.tiered_dropped(run_id)[1])


def _parts(payloads: list[dict[str, Any]], marks: dict[tuple[str, str], int], series: str) -> list[tuple[str, Any]]:
    """(device uuid, summary) of each tiered seq range the ledger dropped, each range once."""
    out, seen = [], set()
    for payload in payloads:
        if payload.get("expired"):
            continue
        found = payload.get("gpu", {}).items() if series == "gpu" else [(_HOST, payload.get("host"))]
        for uuid, part in found:
            if not part:
                continue
            lo, hi = part["seq"]
            upto = marks.get((series, uuid))
            # Still held by the ledger (tiered, not dropped), or the same day recorded twice.
            if upto is None or hi > upto or (uuid, lo, hi) in seen:
                continue
            seen.add((uuid, lo, hi))
            out.append((uuid, part))
    return out


def _add(totals: dict[str, Any], part: dict[str, Any], sums: dict[str, tuple[str, int]]) -> None:
    totals["count"] = int(totals.get("count") or 0) + int(part["rows"])
    for column, (name, scale) in sums.items():
        if not measured(part, name):
            continue  # no row measured it: not measured, as the ledger's SUM of NULLs reads, never 0
        value = part["sums"][name]
        totals[column] = (totals.get(column) or 0) + (value / scale if scale != 1 else value)


def _merge(totals: dict[str, Any], part: dict[str, Any]) -> None:
    """Add ``part`` (a ``series_only_gpu_sums`` device) to ``totals``: None stays None, never 0."""
    totals["count"] = int(totals.get("count") or 0) + int(part["count"])
    for column in ("busy_s", "energy_j"):
        if part.get(column) is not None:
            totals[column] = (totals.get(column) or 0) + part[column]


def series_only_gpu_sums(conn: Connection, run_ids: Collection[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per series-only run of ``run_ids`` (store/series_segments.py: no row in ``gpu_intervals``),
    per device uuid: its rows' count, busy_s and energy_j from ``series_day_sums`` (a column no row
    measured is None, as SQL's SUM of NULLs). One grouped query per chunk; the store is not read."""
    d = schema.series_day_sums.c
    ids = sorted(set(run_ids))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for i in range(0, len(ids), _CHUNK):
        q = (
            sa.select(
                d.run_id,
                d.device_uuid,
                sa.func.sum(d.intervals).label("count"),
                sa.func.sum(d.busy_s).label("busy_s"),
                sa.func.sum(d.energy_j).label("energy_j"),
            )
            .where(d.run_id.in_(ids[i : i + _CHUNK]))
            .group_by(d.run_id, d.device_uuid)
        )
        for r in conn.execute(q).mappings():
            out.setdefault(str(r["run_id"]), {})[str(r["device_uuid"])] = {
                "count": int(r["count"] or 0),
                "busy_s": None if r["busy_s"] is None else float(r["busy_s"]),
                "energy_j": None if r["energy_j"] is None else float(r["energy_j"]),
            }
    return out


def dropped_gpu_sums(conn: Connection, run_ids: Collection[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per run of ``run_ids`` with tiered days the ledger dropped, per device uuid: those days'
    count, samples, busy_s and energy_j (a column no row measured is absent: None, not 0). What
    ``gpu_sums`` adds to the ledger's own sums, for many runs at once; the store is not read."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run_id, parts in dropped_parts(conn, run_ids, "gpu").items():
        for uuid, part in parts:
            _add(out.setdefault(run_id, {}).setdefault(uuid, {"count": 0}), part, GPU_SUMS)
    return out


def dropped_parts(conn: Connection, run_ids: Collection[str], series: str) -> dict[str, list[tuple[str, Any]]]:
    """Per run of ``run_ids`` with tiered days the ledger dropped: (device uuid, or "" for the host
    series; the day's summary) of each such seq range of ``series`` ("gpu" or "host"), each once.
    A summary has ``rows``, ``seq`` [first, last] and ``sums`` in the store's integer units (see
    ``measured``)."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for run_id, (marks, payloads) in _dropped_many(conn, run_ids).items():
        found = _parts(payloads, marks, series)
        if found:
            out[run_id] = found
    return out


def measured(part: dict[str, Any], name: str) -> bool:
    """Whether some row of the summary's seq range measured the sum ``name`` (entries tiered before
    the summary counted measured rows: assumed so, as ``gpu_sums`` adds them)."""
    counted = part.get("measured")
    return counted is None or bool(counted.get(name))


def dropped(conn: Connection, run_id: str) -> tuple[dict[tuple[str, str], int], list[dict[str, Any]]]:
    """The highest seq dropped per (series, device), and the run's ``run.raw_tiered`` payloads, each
    marked ``expired`` when its store has dropped its day since (``Ledger.tiered_dropped``: a
    per-run read, which the server's scoped view of the ledger offers too)."""
    return _dropped_many(conn, [run_id]).get(run_id, ({}, []))


_CHUNK = 500  # run ids per IN (...) list


def _dropped_many(
    conn: Connection, run_ids: Collection[str]
) -> dict[str, tuple[dict[tuple[str, str], int], list[dict[str, Any]]]]:
    """``dropped`` of each run that has a ``run.raw_tiered`` entry, one query per table and chunk."""
    m, a = schema.rollup_marks.c, schema.audit_log.c
    ids = sorted(set(run_ids))
    payloads: dict[str, list[dict[str, Any]]] = {}
    for i in range(0, len(ids), _CHUNK):
        objects = [f"run:{rid}" for rid in ids[i : i + _CHUNK]]
        tq = sa.select(a.object, a.payload).where(a.object.in_(objects), a.action == ACTION).order_by(a.seq)
        for obj, payload in conn.execute(tq):
            payloads.setdefault(str(obj).removeprefix("run:"), []).append(json.loads(payload))
    if not payloads:
        return {}
    out: dict[str, tuple[dict[tuple[str, str], int], list[dict[str, Any]]]] = {
        rid: ({}, p) for rid, p in payloads.items()
    }
    tiered = sorted(payloads)
    for i in range(0, len(tiered), _CHUNK):
        q = sa.select(m.run_id, m.series, m.device_uuid, m.upto_seq).where(
            m.run_id.in_(tiered[i : i + _CHUNK]), m.level_s == DROPPED_LEVEL
        )
        for rid, series, uuid, upto in conn.execute(q):
            out[str(rid)][0][(str(series), str(uuid))] = int(upto)
    wq = sa.select(a.payload).where(a.object == series_window.OBJECT, a.action == series_window.ACTION)
    kept_from: dict[str, str] = {}  # store URL -> the first day it still keeps
    for window in map(json.loads, conn.scalars(wq)):
        kept_from[window["series"]] = max(kept_from.get(window["series"], ""), window["before"])
    for _, found in out.values():
        for p in found:
            p["expired"] = p["day"] < kept_from.get(p.get("series", ""), "")
    return out
