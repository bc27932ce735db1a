"""``gpuledger db migrate --series URL``: the existing raw days of a PostgreSQL ledger copied into
a series store (store/series_migrate.py), progress on stderr."""

from __future__ import annotations

import time
from typing import Any

import click


def tier_existing_days(db: str, series: str, raw_days: float, series_days: int, dry_run: bool) -> None:
    from gpuledger.cli.admin_cmds import _actor
    from gpuledger.cli.audit_cmds import open_tier
    from gpuledger.cli.server_cmds import server_ledger
    from gpuledger.store import series_migrate
    from gpuledger.store.retention import DAY_S, _tampered

    ledger = server_ledger(db)
    try:
        if ledger.dialect != "postgresql":
            raise click.UsageError("--series copies PostgreSQL day partitions: a SQLite ledger has none")
        tier = open_tier(series, series_days)
        try:
            if not dry_run:  # retention drops only rolled-up runs: write the rollups first, as it does
                try:
                    from gpuledger.reports.cost.rollups import materialise_rollups
                except ImportError:
                    pass
                else:
                    materialise_rollups(ledger)
            done = series_migrate.tier_existing(
                ledger, tier, time.time() - raw_days * DAY_S, actor=_actor(), tampered=_tampered, dry_run=dry_run,
                progress=lambda line: click.echo(line, err=True),
            )  # fmt: skip
            streams = _complete_streams(ledger, tier.store, dry_run)
        finally:
            tier.store.close()
    finally:
        ledger.close()
    rows = sum(done.copied.values())
    verb = "would copy" if dry_run else "copied and checked"
    click.echo(
        f"series {tier.url}: {verb} {len(done.copied)} days ({rows} rows); {len(done.done)} days already tiered; "
        f"{len(done.kept)} days retention may not drop yet"
    )
    completed, short = streams
    if completed:
        verb = "would recompute" if dry_run else "recomputed"
        click.echo(
            f"series {tier.url}: {verb} the host CPU and throttle sums of {completed} series-only runs from the store"
        )
    for run_id, expired in short.items():
        days = f" (its days {', '.join(expired)} are past the store's window)" if expired else ""
        click.echo(
            f"series {tier.url}: run {run_id} keeps n/a host CPU and throttle sums: the store no longer holds all "
            f"of its rows{days}, and a sum of what is left would be short"
        )


def _complete_streams(ledger: Any, store: Any, dry_run: bool) -> tuple[int, dict[str, tuple[str, ...]]]:
    """Series-only runs created before migration 20 (their sums miss their first rows): each
    recomputed from the store's rows in a transaction of its own (store/series_streams.py). How
    many runs were completed; the runs left incomplete, as the store no longer holds all their rows
    (-> the days of them it dropped past its window)."""
    from gpuledger.store import series_streams

    runs = ledger.database.read(series_streams.incomplete_runs)
    if dry_run:
        return len(runs), {}
    completed, short = 0, dict[str, tuple[str, ...]]()
    for run_id in runs:
        done = ledger.database.write(lambda conn, run_id=run_id: series_streams.recompute(conn, run_id, store))
        if done.short:
            short[run_id] = done.expired
        else:
            completed += 1
    return completed, short
