"""``gpuledger db migrate --series URL`` (docs/SCALE.md, step 7 in its tiered form): every raw day
of a PostgreSQL ledger that retention may drop is copied into the series store now, checked as
retention checks it (store/series_tier.py), and recorded (``run.raw_tiered``); nothing is dropped.
Resumable: a run's day the trail already records as tiered into this store is skipped, and a copy
cut short stores nothing twice when run again (the batch token)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection

from gpuledger.store import audit, retention_days, series_tier, series_verify

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger


@dataclass
class Migrated:
    copied: dict[str, int] = field(default_factory=dict)  # day -> rows copied (or, dry run, to copy)
    done: list[str] = field(default_factory=list)  # days already tiered into this store
    kept: dict[str, str] = field(default_factory=dict)  # day -> why retention may not drop it yet


def _tiered_runs(conn: Connection, url: str) -> dict[str, set[str]]:
    """Day -> the runs whose rows of that day the trail records as tiered into ``url``."""
    out: dict[str, set[str]] = {}
    for run_id, payload in series_verify.tiered(conn):
        if payload.get("series") == url:
            out.setdefault(str(payload["day"]), set()).add(run_id)
    return out


def tier_existing(
    ledger: Ledger, tier: series_tier.Tier, cut: float, *, actor: str,
    tampered: Callable[[Connection, str], list[str]], dry_run: bool = False,
    progress: Callable[[str], None] = lambda line: None,
) -> Migrated:  # fmt: skip
    """Copy the days that end by ``cut`` and that retention may drop; one transaction per day."""
    if ledger.dialect != "postgresql":
        raise ValueError("tiering copies PostgreSQL day partitions: a SQLite ledger has none")
    out = Migrated()
    by_day = retention_days.old_days(ledger, cut)
    for i, day in enumerate(sorted(by_day), 1):
        date, names = retention_days.date_of(day), by_day[day]

        def tx(conn: Connection, day: int = day, date: str = date, names: list = names) -> str | int:  # type: ignore[type-arg]
            counted = retention_days.locked_day_check(conn, names, cut, tampered)
            if isinstance(counted, str):
                return counted
            rows: dict[str, int] = {}
            for found in counted.values():
                for r in found:
                    rows[r.run_id] = rows.get(r.run_id, 0) + int(r.n)
            todo = set(rows) - _tiered_runs(conn, tier.url).get(date, set())
            if dry_run or not todo:
                return sum(rows[r] for r in todo)
            tiered = retention_days.tier_day(conn, day, names, tier, only=todo)
            if isinstance(tiered, str):
                return tiered
            for run_id in sorted(tiered):
                audit.append(conn, actor=actor, action=series_tier.ACTION, obj=f"run:{run_id}", payload=tiered[run_id])
            return sum(rows[r] for r in todo)

        outcome = ledger.write(tx)
        if isinstance(outcome, str):
            out.kept[date] = outcome
            progress(f"[{i}/{len(by_day)}] {date}: kept in PostgreSQL only: {outcome}")
        elif outcome == 0:
            out.done.append(date)
            progress(f"[{i}/{len(by_day)}] {date}: nothing to copy (already tiered)")
        else:
            out.copied[date] = outcome
            verb = "would copy" if dry_run else "copied and checked"
            progress(f"[{i}/{len(by_day)}] {date}: {verb} {outcome} rows")
    return out
