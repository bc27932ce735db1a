"""``gpuledger report chargeback|capacity --format focus``: the chargeback, or the fleet's capacity, as
a FOCUS 1.3 dataset (the current ratified version), or 1.0 with ``--focus-version 1.0``, the version
the FinOps Foundation's validator checks (docs/FOCUS.md).

CSV to stdout or ``-o FILE``; Parquet when ``-o`` names a ``.parquet`` file. Notes (hours no rate
prices) go to stderr, so stdout stays a clean CSV.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from gpuledger.cli.output import write_text, write_with

__all__ = ["DEFAULT_FOCUS_VERSION", "focus_version_option", "write_capacity_focus", "write_chargeback_focus"]

FOCUS_VERSIONS = ("1.0", "1.3")  # core/chargeback/focus_v13.FOCUS_VERSIONS, without importing it at start-up
DEFAULT_FOCUS_VERSION = "1.3"  # the ratified specification; 1.0 stays for the validator on PyPI, which knows no later

focus_version_option = click.option(
    "--focus-version",
    type=click.Choice(FOCUS_VERSIONS),
    default=DEFAULT_FOCUS_VERSION,
    show_default=True,
    help="--format focus: the FOCUS version of the dataset (1.3: the current spec; 1.0: what the FinOps "
    "validator checks; docs/FOCUS.md).",
)


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
    version: str = DEFAULT_FOCUS_VERSION,
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
        if version == "1.3":
            from gpuledger.core.chargeback.focus_v13 import allocation_cells, to_v13

            export = to_v13(export, allocation_cells(cb.groups, cb.params["by"], share_idle))
    if version == "1.3" and share_idle == "none":
        from gpuledger.core.chargeback.focus_v13 import to_v13

        export = to_v13(export)
    _write(export, output, version)


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
    version: str = DEFAULT_FOCUS_VERSION,
) -> None:
    from gpuledger.reports.capacity.focus import capacity_focus
    from gpuledger.reports.cost.focus import default_identity

    _check_parquet(output)
    identity = default_identity(card, provider)
    export = capacity_focus(
        ledger, card=card, pools=pools, start=lo, end=hi, identity=identity, include_replayed=include_replayed
    )
    if version == "1.3":
        from gpuledger.core.chargeback.focus_v13 import to_v13

        export = to_v13(export)
    _write(export, output, version)


def _check_parquet(output: str | None) -> None:
    """A missing [parquet] extra is said before any work."""
    from gpuledger.reports.cost.focus_render import is_parquet_path

    if is_parquet_path(output):
        from gpuledger.extras import require

        require("pyarrow.parquet", extra="parquet", purpose="FOCUS Parquet output")


def _write(export: Any, output: str | None, version: str = DEFAULT_FOCUS_VERSION) -> None:
    from gpuledger.core.chargeback.focus_v13 import columns_for
    from gpuledger.reports.cost.focus_render import focus_csv, is_parquet_path, write_focus_parquet

    columns = columns_for(version)
    for note in export.notes:
        click.echo(f"note: {note}", err=True)
    if is_parquet_path(output):
        write_with(str(output), lambda fh: write_focus_parquet(export, fh, columns))
        click.echo(f"wrote {output}", err=True)
    else:
        write_text(output, focus_csv(export, columns), announce=True)
