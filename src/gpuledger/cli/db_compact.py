"""``gpuledger db migrate --layout compact --series URL``: a PostgreSQL ledger's runs moved run by
run into the layout ``serve --series-only`` writes (store/series_compact.py), progress on stderr."""

from __future__ import annotations

import os

import click


def series_url(series: str | None) -> str:
    """--series, else GPULEDGER_SERIES: the store the compact layout keeps raw intervals in."""
    url = series or os.environ.get("GPULEDGER_SERIES") or ""
    if not url:
        raise click.UsageError("--layout compact moves raw intervals into a series store: give --series URL")
    return url


def compact_ledger(db: str, series: str, series_days: int, dry_run: bool) -> None:
    from gpuledger.cli.admin_cmds import _actor
    from gpuledger.cli.audit_cmds import open_tier
    from gpuledger.cli.server_cmds import server_ledger
    from gpuledger.store import series_compact
    from gpuledger.store.retention import _tampered

    ledger = server_ledger(db)
    try:
        if ledger.dialect != "postgresql":
            raise click.UsageError(
                "--layout compact is for a PostgreSQL team ledger: a SQLite ledger keeps its intervals as they are"
            )
        tier = open_tier(series, series_days)
        try:
            done = series_compact.compact(
                ledger, tier, actor=_actor(), tampered=_tampered, dry_run=dry_run,
                progress=lambda line: click.echo(line, err=True),
            )  # fmt: skip
        finally:
            tier.store.close()
    finally:
        ledger.close()
    rows = sum(done.moved.values())
    verb = "would move" if dry_run else "moved and checked"
    click.echo(
        f"series {tier.url}: {verb} {len(done.moved)} runs ({rows} rows) into the compact layout; "
        f"{len(done.done)} runs compact already; {len(done.kept)} runs kept in PostgreSQL for now"
        + (f"; {len(done.failed)} runs NOT moved (the store's check failed)" if done.failed else "")
    )
    if done.failed:
        raise SystemExit(1)
