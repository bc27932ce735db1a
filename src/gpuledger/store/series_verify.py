"""``gpuledger audit verify --series URL``: every day the audit trail says was tiered into that
series store (``run.raw_tiered``, store/series_tier.py) must still be there exactly: the same
rows per GPU and host, the same sums, the same digest. A changed or missing row is named by run,
device and seq range."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series.base import SeriesStore
from gpuledger.store import schema, series_tier

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger


@dataclass
class SeriesCheck:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    days_checked: int = 0  # (run, day) pairs compared with the store


def tiered(conn: Connection) -> Iterator[tuple[str, dict[str, Any]]]:
    """(run id, payload) of every ``run.raw_tiered`` entry, oldest first."""
    a = schema.audit_log.c
    q = sa.select(a.object, a.payload).where(a.action == series_tier.ACTION).order_by(a.seq)
    for obj, payload in conn.execute(q):
        yield obj.removeprefix("run:"), json.loads(payload)


def check(ledger: Ledger, store: SeriesStore, url: str) -> SeriesCheck:
    """Compare the store at ``url`` with every tier recorded for it; tiers into another store are
    named in a note, not checked."""
    out = SeriesCheck()
    shown = series_tier.shown_url(url)
    others: set[str] = set()
    for run_id, payload in ledger.read(lambda c: list(tiered(c))):
        if payload.get("series") != shown:
            others.add(str(payload.get("series")))
            continue
        found = series_tier.stored_summary(store, run_id, payload)
        lines = series_tier.differences(run_id, payload, found)
        out.problems += [f"{line} (tiered {payload['day']})" for line in lines]
        out.days_checked += 1
    for other in sorted(others):
        out.notes.append(f"days tiered into {other} were not checked (give that store with --series)")
    return out
