"""``gpuledger report chargeback|capacity --format focus``: the chargeback, or the fleet's capacity, as
a FOCUS 1.0 dataset (docs/FOCUS.md).

CSV to stdout or ``-o FILE``; Parquet when ``-o`` names a ``.parquet`` file. Notes (hours no rate
prices) go to stderr, so stdout stays a clean CSV.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from gpuledger.cli.output import write_text, write_with

__all__ = ["write_capacity_focus", "write_chargeback_focus"]


def write_chargeback_focus(
    ledger: Any,
    card: Any,
    lo: float,
    hi: float,
    *,
    scope: frozenset[str] | None,
    basis: str | None,
    by: Sequence[str],
    share_idle: str,
    pools: str | None,
    provider: str | None,
    output: str | None,
    include_replayed: bool = False,
) -> None:
    from gpuledger.core.months import month_of
    from gpuledger.reports.cost.focus import add_shared_idle_rows, chargeback_focus, default_identity

    _check_parquet(output)
    if share_idle != "none" and month_of(lo) != month_of(hi - 1e-6):
        raise click.UsageError(
            "with --share-idle, FOCUS output needs one month's window (--month): the shared idle cost is one "
            "figure for the window, and a FOCUS row belongs to one billing period (a calendar month)"
        )
    identity = default_identity(card, provider)
    export = chargeback_focus(
        ledger, scope=scope, card=card, start=lo, end=hi, basis=basis, identity=identity,
        include_replayed=include_replayed,
    )  # fmt: skip
    if share_idle != "none":
        from gpuledger.cli.capacity_cmds import shared_idle
        from gpuledger.reports.cost.costing import chargeback

        cb = chargeback(
            ledger, scope=scope, card=card, start=lo, end=hi, by=by, basis=basis, trend_months=0,
            include_replayed=include_replayed,
        )  # fmt: skip
        cb = shared_idle(cb, ledger, card, lo, hi, share_idle, pools, include_replayed=include_replayed)
        export = add_shared_idle_rows(export, cb, card=card, start=lo, end=hi, identity=identity)
    _write(export, output)


def write_capacity_focus(
    ledger: Any,
    card: Any,
    pools: Any,
    lo: float,
    hi: float,
    *,
    provider: str | None,
    output: str | None,
    include_replayed: bool = False,
) -> None:
    from gpuledger.reports.capacity.focus import capacity_focus
    from gpuledger.reports.cost.focus import default_identity

    _check_parquet(output)
    identity = default_identity(card, provider)
    export = capacity_focus(
        ledger, card=card, pools=pools, start=lo, end=hi, identity=identity, include_replayed=include_replayed
    )
    _write(export, output)


def _check_parquet(output: str | None) -> None:
    """A missing [parquet] extra is said before any work."""
    from gpuledger.reports.cost.focus_render import is_parquet_path

    if is_parquet_path(output):
        from gpuledger.extras import require

        require("pyarrow.parquet", extra="parquet", purpose="FOCUS Parquet output")


def _write(export: Any, output: str | None) -> None:
    from gpuledger.reports.cost.focus_render import focus_csv, is_parquet_path, write_focus_parquet

    for note in export.notes:
        click.echo(f"note: {note}", err=True)
    if is_parquet_path(output):
        write_with(str(output), lambda fh: write_focus_parquet(export, fh))
        click.echo(f"wrote {output}", err=True)
    else:
        write_text(output, focus_csv(export), announce=True)
