"""``gpuledger audit verify|seal|head`` and ``gpuledger retention run``."""

from __future__ import annotations

import sys

import click

from gpuledger.cli.admin_cmds import _account_errors, _actor
from gpuledger.cli.common import echo_json
from gpuledger.cli.server_cmds import db_required, server_ledger


@click.group("audit")
def audit_group() -> None:
    """The tamper-evident audit trail of a team ledger."""


@audit_group.command("verify")
@db_required
@click.option(
    "--expect-head", metavar="SEQ:HASH", help="A head recorded earlier (gpuledger audit head): must still be there."
)
@click.option("--json", "as_json", is_flag=True)
@_account_errors
def verify_cmd(db: str | None, expect_head: str | None, as_json: bool) -> None:
    """Check the hash chain and every sealed run; name each row that differs. Exit 1 on any."""
    from gpuledger.store import audit

    result = audit.verify(server_ledger(db), expect_head=expect_head)
    if as_json:
        echo_json({**result.__dict__, "ok": result.ok})
    else:
        for line in result.problems:
            click.echo(f"TAMPERED  {line}")
        click.echo(
            f"{'OK' if result.ok else 'FAILED'}: {result.rows} audit rows, {result.runs_checked} sealed runs checked, "
            f"{result.unsealed_running} running; head {result.head_seq}:{result.head_hash}"
        )
    if not result.ok:
        sys.exit(1)


@audit_group.command("head")
@db_required
@_account_errors
def head_cmd(db: str | None) -> None:
    """Print the chain's head as SEQ:HASH: keep it outside the database (e.g. daily, in a ticket
    or a git repo); ``verify --expect-head`` then also catches a rewritten tail."""
    from gpuledger.store import audit

    result = audit.verify(server_ledger(db))
    click.echo(f"{result.head_seq}:{result.head_hash}")


@audit_group.command("seal")
@db_required
@_account_errors
def seal_cmd(db: str | None) -> None:
    """Seal finished runs whose agent never sent its last batch."""
    from gpuledger.store import audit

    ids = audit.seal_unsealed(server_ledger(db), actor=_actor())
    click.echo(f"sealed {len(ids)} runs")


@click.group("retention")
def retention_group() -> None:
    """Roll old intervals up, delete old logs (and runs, if asked)."""


@retention_group.command("run")
@db_required
@click.option(
    "--raw-days", type=click.FloatRange(0), default=7.0, show_default=True, help="Keep raw intervals this long."
)
@click.option(
    "--minute-days",
    type=click.FloatRange(0),
    default=90.0,
    show_default=True,
    help="Then 1-minute intervals this long; 1-hour ones after.",
)
@click.option(
    "--log-days",
    type=click.FloatRange(0),
    default=90.0,
    show_default=True,
    help="Delete logs of runs ended longer ago.",
)
@click.option("--keep-logs", is_flag=True, help="Never delete logs.")
@click.option("--run-days", type=click.FloatRange(0), help="Delete whole runs ended longer ago (default: never).")
@_account_errors
def retention_run_cmd(
    db: str | None, raw_days: float, minute_days: float, log_days: float, keep_logs: bool, run_days: float | None
) -> None:  # fmt: skip
    """Apply the retention policy once (schedule it daily, e.g. with cron or a systemd timer)."""
    from gpuledger.store.retention import Policy, run_retention

    try:
        from gpuledger.reports.cost_rollups import materialise_rollups
    except ImportError:
        materialise_rollups = None  # type: ignore[assignment]
    policy = Policy(raw_days, max(minute_days, raw_days), None if keep_logs else log_days, run_days)
    report = run_retention(server_ledger(db), policy, actor=_actor(), cost_rollups=materialise_rollups)
    levels = ", ".join(f"{n} runs to {lvl} s" for lvl, n in sorted(report.rolled_up.items())) or "nothing"
    click.echo(
        f"rolled up {levels} ({report.rows_before} -> {report.rows_after} interval rows); "
        f"{report.logs_deleted} logs and {report.runs_deleted} runs deleted"
    )
    for run_id, why in report.skipped.items():
        click.echo(f"SKIPPED {run_id}: {why}", err=True)
    if report.skipped:
        sys.exit(1)
