"""``gpuledger audit verify --series URL``: every day the audit trail says was tiered into that
series store (``run.raw_tiered``, store/series_tier.py) must still be there exactly: the same
rows per GPU and host, the same sums, the same digest. A changed or missing row is named by run,
device and seq range. A day the store dropped on purpose, past its own window (a later
``series.days_dropped`` entry for that store, store/series_window.py), is named as expired instead
and not read; a day gone without such an entry is still missing. The same for each host's day of
capacity intervals retention tiered (``capacity.raw_tiered``, store/capacity_tier.py). On
ClickHouse a tiered run day's rollups, which views write after the raw rows, must not be short of
them either (series_tier.rollup_differences): a kill between the two would leave chargeback short
though every raw row is there. A sealed
series-only run is checked as store/series_only_verify.py says, by the same rule for the days its
store dropped."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series.base import SeriesStore
from gpuledger.store import (
    capacity_tier,
    schema,
    series_day_sums,
    series_only_verify,
    series_only_window,
    series_segments,
    series_tier,
    series_window,
)

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger


@dataclass
class SeriesCheck:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    days_checked: int = 0  # (run, day) pairs compared with the store
    days_expired: int = 0  # (run or host, day) pairs the store dropped past its window, by retention
    runs_checked: int = 0  # series-only runs whose sealed intervals were compared with the store
    run_days_expired: int = 0  # (series-only run, day) pairs the store dropped past its window
    capacity_checked: int = 0  # (host, day) capacity batches tiered by retention, compared with the store


def tiered(conn: Connection) -> Iterator[tuple[str, dict[str, Any]]]:
    """(run id, payload) of every ``run.raw_tiered`` entry, oldest first."""
    for _seq, run_id, payload in _tiered(conn):
        yield run_id, payload


def _tiered(conn: Connection, action: str = series_tier.ACTION) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(seq, run id or host, payload) of each tier entry (``action``: runs' or capacity's), oldest first."""
    a = schema.audit_log.c
    q = sa.select(a.seq, a.object, a.payload).where(a.action == action).order_by(a.seq)
    for seq, obj, payload in conn.execute(q):
        yield seq, obj.removeprefix("run:").removeprefix("host:"), json.loads(payload)


def _expiries(conn: Connection, shown: str) -> list[tuple[int, str, str]]:
    """(seq, first day kept, date of the run) of each ``series.days_dropped`` entry for the store."""
    a = schema.audit_log.c
    q = sa.select(a.seq, a.t, a.payload).where(a.object == series_window.OBJECT, a.action == series_window.ACTION)
    out = []
    for seq, t, payload in conn.execute(q.order_by(a.seq)):
        found = json.loads(payload)
        if found.get("series") == shown:
            out.append((seq, str(found["before"]), time.strftime("%Y-%m-%d", time.gmtime(t))))
    return out


def _expired_by(expiries: list[tuple[int, str, str]], seq: int, day: str) -> str | None:
    """The date of the first retention run after the tier entry ``seq`` that dropped ``day``."""
    return next((on for at, before, on in expiries if at > seq and day < before), None)


def check(ledger: Ledger, store: SeriesStore, url: str) -> SeriesCheck:
    """Compare the store at ``url`` with every tier recorded for it; tiers into another store are
    named in a note, not checked."""
    out = SeriesCheck()
    shown = series_tier.shown_url(url)
    others: set[str] = set()
    expiries = ledger.read(lambda c: _expiries(c, shown))
    expired: dict[tuple[str, str], list[str]] = {}  # (retention's date, what) -> the tiered days it dropped
    only_expired: dict[str, list[str]] = {}  # retention's date -> the series-only runs' days it dropped
    kinds = ((series_tier, "run days", "days_checked"), (capacity_tier, "capacity host days", "capacity_checked"))
    for kind, what, counted in kinds:  # a run's tiered days (by run), capacity's (by host)
        for seq, key, payload in ledger.read(lambda c, action=kind.ACTION: list(_tiered(c, action))):
            if payload.get("series") != shown:
                others.add(str(payload.get("series")))
                continue
            on = _expired_by(expiries, seq, payload["day"])
            if on is not None:
                expired.setdefault((on, what), []).append(payload["day"])
                out.days_expired += 1
                continue
            lines = kind.differences(key, payload, kind.stored_summary(store, key, payload))
            if kind is series_tier and not lines:  # ClickHouse: the day's rollups (chargeback's) against
                # its raw rows, once those are as tiered (a changed row is named above already)
                lines += series_tier.rollup_differences(store, key, payload, payload["day"])
            out.problems += [f"{line} (tiered {payload['day']})" for line in lines]
            setattr(out, counted, getattr(out, counted) + 1)
    kept = ledger.read(lambda c: series_only_window.kept_from(c, shown))
    for run_id, payload in ledger.read(series_segments.series_seals).items():  # series-only runs
        if payload.get("series") != shown:
            others.add(str(payload.get("series")))
            continue
        sums = ledger.read(lambda c, rid=run_id: series_day_sums.run_sums(c, rid))
        run = series_only_verify.check(store, run_id, payload, kept, sums)
        out.problems += run.problems
        out.notes += run.notes
        for day in run.expired:
            on = _expired_by(expiries, -1, day) or "?"
            only_expired.setdefault(on, []).append(day)
        out.run_days_expired += len(run.expired)
        out.runs_checked += 1
    for (on, what), days in sorted(expired.items()):
        span = min(days) if min(days) == max(days) else f"{min(days)} to {max(days)}"
        out.notes.append(f"{len(days)} tiered {what} ({span}) expired from the series store by retention on {on}")
    for on, days in sorted(only_expired.items()):
        span = min(days) if min(days) == max(days) else f"{min(days)} to {max(days)}"
        out.notes.append(
            f"{len(days)} series-only run days ({span}) expired from the series store by retention on {on}: "
            "not read; the days it keeps were checked against the seal and the day sums"
        )
    for other in sorted(others):
        out.notes.append(f"days tiered into {other} were not checked (give that store with --series)")
    return out
