"""A series-only run's host CPU, throttle time and last-row gauges, kept push by push.

``/metrics`` shows of a plain run's rows more than ``series_day_sums`` keeps (busy, energy): the
run's CPU time (host rows), each GPU's throttle time per reason, and the gauges of each GPU's
latest row (power, memory used, temperature). For a series-only run (store/series_segments.py)
each push adds its new rows to ``series_streams`` (schema_series_streams.py) in its own
transaction, one ``INSERT ... ON CONFLICT DO UPDATE`` for all its streams: the sums in integer µs
as prom/series.units rounds each row (the plain run's sums, to the unit), a NULL staying NULL
until a row measures it, and the gauges replaced only by a row with a higher seq than the one
they came from, so a late row filling a gap leaves them. Only the rows the segments found new
come here, so a resent batch adds nothing and a rolled-back push added nothing.
"""

from __future__ import annotations

import collections
import functools
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from gpuledger.prom.series import MICRO, units
from gpuledger.store import schema
from gpuledger.store.schema_series_streams import GAUGES, REASONS, throttle_column

HOST = ""  # the host stream's device_uuid, as in series_segments
_THROTTLE = {r: throttle_column(r) for r in REASONS}
_SUMS = ("cpu_us", *_THROTTLE.values())
_CHUNK = 500  # run ids per IN (...) list


def _blank(run_id: str, uuid: str) -> dict[str, Any]:
    return {"run_id": run_id, "device_uuid": uuid, "complete": True, "last_seq": -1, **dict.fromkeys((*GAUGES, *_SUMS))}


def _plus(total: int | None, value: int | None) -> int | None:
    return total if value is None else value if total is None else total + value


def stream_rows(
    run_id: str,
    gpu: Sequence[Sequence[Any]],
    gpu_columns: Sequence[str],
    host: Sequence[Sequence[Any]],
    host_columns: Sequence[str],
) -> list[dict[str, Any]]:
    """Per stream of the new rows: their sums and the gauges of the one with the highest seq."""
    out: dict[str, dict[str, Any]] = {}
    if gpu:
        uuid_at, seq_at, throttle_at = (gpu_columns.index(c) for c in ("device_uuid", "seq", "throttle_s"))
        gauges_at = [(c, gpu_columns.index(c)) for c in GAUGES]
    for r in gpu:
        uuid = str(r[uuid_at])
        row = out.get(uuid)
        if row is None:
            row = out[uuid] = _blank(run_id, uuid)
        throttle = r[throttle_at]
        if isinstance(throttle, str):  # as JSON text (a row read back rather than validated)
            throttle = json.loads(throttle)
        for reason, seconds in (throttle or {}).items():
            col = _THROTTLE.get(reason)
            if col is not None:  # a reason /metrics does not count has no column
                row[col] = _plus(row[col], units(seconds, MICRO))
        seq = int(r[seq_at])
        if seq > row["last_seq"]:
            row["last_seq"] = seq
            for c, at in gauges_at:
                row[c] = r[at]
    if host:
        seq_at, cpu_at = host_columns.index("seq"), host_columns.index("cpu_s")
        row = out[HOST] = _blank(run_id, HOST)
        for r in host:
            row["cpu_us"] = _plus(row["cpu_us"], units(r[cpu_at], MICRO))
            row["last_seq"] = max(row["last_seq"], int(r[seq_at]))
    return list(out.values())


def _summed(old: Any, new: Any) -> Any:
    """old + new where NULL is "never measured": NULL only when both are."""
    return sa.case((old.is_(None), new), (new.is_(None), old), else_=old + new)


@functools.cache
def _upsert(dialect: str) -> Any:
    """The statement ``add`` runs, built once per dialect (building it costs more than running it)."""
    t = schema.series_streams
    ins = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(t)
    ex = ins.excluded
    later = ex.last_seq > t.c.last_seq
    set_: dict[str, Any] = {c: _summed(t.c[c], ex[c]) for c in _SUMS}
    set_ |= {c: sa.case((later, ex[c]), else_=t.c[c]) for c in GAUGES}
    set_["last_seq"] = sa.case((later, ex.last_seq), else_=t.c.last_seq)
    return ins.on_conflict_do_update(index_elements=[t.c.run_id, t.c.device_uuid], set_=set_)


def add(
    conn: Connection,
    run_id: str,
    gpu: Sequence[Sequence[Any]],
    gpu_columns: Sequence[str],
    host: Sequence[Sequence[Any]],
    host_columns: Sequence[str],
) -> int:
    """Add the push's new rows (kept by series_segments.keep_new) to the run's streams: one
    statement for them all; the streams written."""
    rows = stream_rows(run_id, gpu, gpu_columns, host, host_columns)
    if rows:
        conn.execute(_upsert(conn.dialect.name), rows)
    return len(rows)


def read(conn: Connection, run_ids: Collection[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """(run id, device uuid; HOST for the host stream) -> the stream's row, of those of ``run_ids``
    that have one (series-only runs); one query per chunk."""
    s = schema.series_streams
    ids = sorted(set(run_ids))
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for i in range(0, len(ids), _CHUNK):
        for r in conn.execute(sa.select(s).where(s.c.run_id.in_(ids[i : i + _CHUNK]))).mappings():
            out[(str(r["run_id"]), str(r["device_uuid"]))] = dict(r)
    return out


def throttle_us(row: Mapping[str, Any]) -> dict[str, int | None]:
    """A GPU stream's throttle µs per reason; None for each when the stream is not complete (its
    first rows predate the table: the sums miss them, so they are not shown)."""
    if not row["complete"]:
        return dict.fromkeys(REASONS)
    return {r: row[throttle_column(r)] for r in REASONS}


def cpu_us(row: Mapping[str, Any]) -> int | None:
    """The host stream's CPU µs; None when not measured or the stream is not complete."""
    return row["cpu_us"] if row["complete"] else None


def incomplete_runs(conn: Connection) -> list[str]:
    """The runs with a stream whose sums miss rows the store held before migration 20."""
    c = schema.series_streams.c
    return sorted(str(r) for r in conn.scalars(sa.select(c.run_id).where(c.complete.is_(False)).distinct()))


@dataclass(frozen=True)
class Recomputed:
    """What ``recompute`` did of one run's incomplete streams."""

    completed: int = 0  # streams whose sums now count every row the segments hold
    short: int = 0  # streams left incomplete: the store no longer holds all their rows
    expired: tuple[str, ...] = ()  # the run's days its store dropped past its window (the trail's word)


def recompute(conn: Connection, run_id: str, store: Any) -> Recomputed:
    """Recompute the run's incomplete streams from the rows ``store`` (a series/base.SeriesStore)
    holds of it within its segments (rows a failed ledger commit left there are not the run's),
    under the run's row lock so no push of it interleaves; the streams completed. The store's rows
    are quantized to its units (series/quantum.py), so these sums are to those units.
    A stream some of whose rows the store no longer holds (days it dropped past its window, or a
    TTL removed) cannot be completed: summing what is left would show a part as the whole, so it
    stays incomplete (its sums read n/a) and is counted as ``short``."""
    from gpuledger.store import series_only_window, series_segments

    s = schema.series_streams
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(schema.runs.c.id).where(schema.runs.c.id == run_id).with_for_update())
    todo = set(conn.scalars(sa.select(s.c.device_uuid).where(s.c.run_id == run_id, s.c.complete.is_(False))))
    if not todo:
        return Recomputed()
    spans = series_segments.segments(conn, run_id, todo)

    def held(uuid: str, seq: int) -> bool:
        return any(sp.first_seq <= seq <= sp.last_seq for sp in spans.get(uuid, ()))

    gpu_cols = ("device_uuid", "seq", "throttle_s", *GAUGES)
    gpu = [tuple(r.get(c) for c in gpu_cols) for r in store.gpu_intervals(run_id) if held(r["device_uuid"], r["seq"])]
    host = [(r["seq"], r["cpu_s"]) for r in store.host_intervals(run_id) if HOST in todo and held(HOST, r["seq"])]
    found = {r["device_uuid"]: r for r in stream_rows(run_id, gpu, gpu_cols, host, ("seq", "cpu_s"))}
    got = collections.Counter([str(r[0]) for r in gpu] + [HOST] * len(host))
    short = {u for u in todo if got[u] < sum(sp.last_seq - sp.first_seq + 1 for sp in spans.get(u, ()))}
    for uuid in todo - short:
        values = {
            k: v for k, v in (found.get(uuid) or _blank(run_id, uuid)).items() if k not in ("run_id", "device_uuid")
        }
        conn.execute(sa.update(s).where(s.c.run_id == run_id, s.c.device_uuid == uuid).values(**values))
    expired = tuple(series_only_window.expired_days(conn, run_id)) if short else ()
    return Recomputed(len(todo - short), len(short), expired)
