"""``gpuledger serve``, ``gpuledger db migrate|status`` and ``gpuledger sync`` (``--status``, ``--forget``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpuledger.cli.common import (
    FiniteFloat,
    check_ledger_url,
    cli_errors,
    echo_json,
    format_option,
    refuse_missing_ledger,
)
from gpuledger.cli.token_file_check import token_file_given

if TYPE_CHECKING:
    from gpuledger.store import Ledger
    from gpuledger.store.capacity_push import Outbox


def server_ledger(url: str | None):
    """The ledger at --db, never migrated implicitly (schema changes: gpuledger db migrate)."""
    from gpuledger.store import Ledger, LedgerError, audit_checkpoint

    if not url:
        raise click.UsageError("give the database with --db URL (or GPULEDGER_DB)")
    check_ledger_url(url)
    refuse_missing_ledger(url)  # a mistyped SQLite path: not a new empty file (gpuledger db migrate creates one)
    try:
        ledger = Ledger(url, migrate=False)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    audit_checkpoint.guard_writer(ledger.database.engine, url)  # no append to a chain cut below the checkpoint
    return ledger


def db_required(func):  # type: ignore[no-untyped-def]
    return click.option(
        "--db", envvar="GPULEDGER_DB", metavar="URL", help="The ledger database (postgresql+psycopg://...)."
    )(func)


def _trusted_proxies(ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> None:
    from gpuledger.server import proxies

    try:
        ctx.meta["gpuledger.trusted_proxies"] = proxies.parse(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _proxy_options() -> dict[str, object]:
    """uvicorn.run's proxy settings from --trusted-proxy (server/proxies.py)."""
    from gpuledger.server import proxies

    return proxies.uvicorn_options(click.get_current_context().meta.get("gpuledger.trusted_proxies", []))


def _close_after_days(ctx: click.Context, _param: click.Parameter, days: float) -> None:
    ctx.meta["gpuledger.close_after_days"] = days  # exported with the rest once serve is past its checks


@click.command("serve")
@db_required
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True, help="Worker processes.")
@click.option(
    "--trusted-proxy", "trusted_proxies", multiple=True, metavar="CIDR", callback=_trusted_proxies, expose_value=False,
    envvar="GPULEDGER_TRUSTED_PROXY",
    help="A proxy whose X-Forwarded-For names the client (repeatable). Default none: the peer is the client.",
)  # fmt: skip
@click.option("--rates", type=click.Path(exists=True, dir_okay=False), help="Rate card for chargeback reports.")
@click.option("--max-body-mb", type=FiniteFloat(0.001, 1024), default=8.0, show_default=True)
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info")
@click.option(
    "--close-after-days", type=FiniteFloat(0, 3650), default=3.0, show_default=True,
    envvar="GPULEDGER_CLOSE_AFTER_DAYS",
    callback=_close_after_days, expose_value=False,
    help="A month's bill is final this many days after it ends: no run or row dated in it is taken after that.",
)  # fmt: skip
@click.option(
    "--unsigned", is_flag=True, help="Run without an audit key: the trail is a hash chain only (docs/AUDIT.md)."
)
@click.option(
    "--checkpoint", envvar="GPULEDGER_AUDIT_CHECKPOINT", type=click.Path(dir_okay=False), metavar="FILE",
    help="The signed audit checkpoint kept outside the database (default: one per ledger under the data dir).",
)  # fmt: skip
@click.option(
    "--series", envvar="GPULEDGER_SERIES", metavar="URL",
    help="The series store raw days were tiered into (retention run --series): a run's intervals are read "
    "whole from it and the ledger.",
)  # fmt: skip
@click.option(
    "--series-live", is_flag=True, envvar="GPULEDGER_SERIES_LIVE",
    help="Also write each push's new GPU, host and capacity intervals into the --series store (created where missing), "
    "acknowledged only once the ledger and the store both hold them; a store that fails: 503, nothing kept, the "
    "agent sends again. Needs a PostgreSQL --db. Env GPULEDGER_SERIES_LIVE=1.",
)  # fmt: skip
@click.option(
    "--series-only", is_flag=True, envvar="GPULEDGER_SERIES_ONLY",
    help="--series-live, and runs this server creates keep their GPU and host intervals in the --series store "
    "only: the ledger keeps their runs, audit and the seq ranges the store holds, not the rows (docs/SCALE.md "
    "section 5). Such a run's later pushes need a server with the store. Env GPULEDGER_SERIES_ONLY=1.",
)  # fmt: skip
@click.option(
    "--series-batch-rows", type=click.IntRange(0), default=10_000, show_default=True,
    envvar="GPULEDGER_SERIES_BATCH_ROWS",
    help="With --series-live on ClickHouse: concurrent pushes' rows are written as one insert once this many "
    "wait, or --series-batch-ms after the first, or when no other push is on its way; each push is acknowledged "
    "once its insert is stored. 0: one insert per push. Env GPULEDGER_SERIES_BATCH_ROWS.",
)  # fmt: skip
@click.option(
    "--series-batch-ms", type=FiniteFloat(0, 60_000), default=1000.0, show_default=True,
    envvar="GPULEDGER_SERIES_BATCH_MS",
    help="The longest a push waits for others to share its insert (0: none; pushes still share one while the "
    "store is busy). Env GPULEDGER_SERIES_BATCH_MS.",
)  # fmt: skip
@cli_errors
def serve_cmd(
    db: str | None, host: str, port: int, workers: int, rates: str | None, max_body_mb: float, log_level: str,
    unsigned: bool, checkpoint: str | None, series: str | None, series_live: bool, series_only: bool,
    series_batch_rows: int, series_batch_ms: float,
) -> None:  # fmt: skip
    """Serve the team API (docs/SERVER.md). Stateless: run several behind a load balancer.

    Needs the [server] extra: pip install 'gpuledger[server]'. Limits, timeouts and rate limits
    are GPULEDGER_* environment variables (docs/SERVER.md)."""
    from gpuledger.extras import require
    from gpuledger.store import display_url

    for module in ("fastapi", "pydantic", "uvicorn"):
        require(module, extra="server", purpose="gpuledger serve")
    import uvicorn

    from gpuledger.cli import serve_audit
    from gpuledger.store import audit_checkpoint

    ledger = server_ledger(db)  # refuses an outdated schema with the command to fix it
    assert db is not None
    if series_only and not series:
        ledger.close()
        raise click.UsageError("--series-only keeps the intervals in the series store: give it with --series URL")
    series_live = series_live or series_only
    if series_live and not series:
        ledger.close()
        raise click.UsageError("--series-live writes into the series store: give it with --series URL")
    if series_live and ledger.dialect != "postgresql":
        ledger.close()
        raise click.UsageError("--series-live needs a PostgreSQL ledger (--db postgresql://...)")
    path = Path(checkpoint).expanduser().absolute() if checkpoint else audit_checkpoint.default_path(db).absolute()
    try:  # no key on a signed ledger, a key others can read, a chain below its checkpoint: refused here
        click.echo(serve_audit.check(ledger, db, unsigned=unsigned, checkpoint=path), err=True)
    finally:
        ledger.close()
    if series:  # refused here, before serving, when it names no store or cannot be reached
        from gpuledger.cli.audit_cmds import open_tier

        open_tier(series, create=series_live).store.close()  # live writes need its tables
    # the workers read these (server/settings.py); set only now, so a refused serve leaves the
    # caller's environment as it was (an in-process caller would otherwise inherit this checkpoint)
    days = click.get_current_context().meta.get("gpuledger.close_after_days", 3.0)
    os.environ["GPULEDGER_CLOSE_AFTER_DAYS"] = repr(days)
    os.environ[audit_checkpoint.ENV_PATH] = str(path)  # the workers keep this file
    os.environ["GPULEDGER_SERVER_DB"] = db
    os.environ["GPULEDGER_MAX_BODY_B"] = str(int(max_body_mb * 1024 * 1024))
    if rates:
        os.environ["GPULEDGER_RATES"] = os.path.abspath(rates)
    if series:
        os.environ["GPULEDGER_SERIES"] = series  # Settings.series
    if series_live:
        os.environ["GPULEDGER_SERIES_LIVE"] = "1"  # Settings.series_live
    if series_only:
        os.environ["GPULEDGER_SERIES_ONLY"] = "1"  # Settings.series_only
    os.environ["GPULEDGER_SERIES_BATCH_ROWS"] = str(series_batch_rows)  # Settings.series_batch_rows
    os.environ["GPULEDGER_SERIES_BATCH_MS"] = repr(series_batch_ms)
    click.echo(f"gpuledger: serving {display_url(db)} on http://{host}:{port} ({workers} worker(s))", err=True)
    uvicorn.run(
        "gpuledger.server.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        access_log=log_level == "debug",
        timeout_graceful_shutdown=10,
        http="gpuledger.server.http_protocol:TimedHttpProtocol",  # a deadline for request headers
        **_proxy_options(),  # X-Forwarded-For only from --trusted-proxy (default: from nobody)
    )


@click.group("db")
def db_group() -> None:
    """The ledger's schema: status and migrations."""


@db_group.command("migrate")
@db_required
@click.option(
    "--series", metavar="URL",
    help="Then copy every raw day retention may drop (older than --raw-days, runs ended, rolled up and sealed) "
    "into this series store, checked, and record it (docs/SCALE.md, Tiering); days already tiered are skipped. "
    "Series-only runs from before migration 20 get their CPU and throttle sums recomputed from the store.",
)  # fmt: skip
@click.option("--raw-days", type=FiniteFloat(0), default=7.0, show_default=True, help="With --series: days kept raw.")
@click.option(
    "--series-days", type=click.IntRange(1), default=366, show_default=True,
    help="With --series, ClickHouse: how long the store keeps raw rows (its TTL).",
)  # fmt: skip
@click.option(
    "--layout", type=click.Choice(["compact"]),
    help="compact: then move each ended run's raw intervals into the series store (--series, or "
    "GPULEDGER_SERIES) run by run, checked, keeping in PostgreSQL only their seq ranges, day sums and the "
    "store's seal, as serve --series-only does (docs/SCALE.md, Migration); resumable.",
)  # fmt: skip
@click.option("--dry-run", is_flag=True, help="With --series: say what would be copied or moved; change nothing.")
@cli_errors
def db_migrate_cmd(
    db: str | None, series: str | None, raw_days: float, series_days: int, layout: str | None, dry_run: bool
) -> None:
    """Apply pending schema migrations (safe with several processes; each runs once); with
    --series, tier the existing raw days into a series store; with --layout compact, move each
    ended run's raw intervals into it."""
    from gpuledger.store import migrations
    from gpuledger.store.engine import Database

    if not db:
        raise click.UsageError("give the database with --db URL (or GPULEDGER_DB)")
    check_ledger_url(db)
    if layout:
        from gpuledger.cli.db_compact import compact_ledger, series_url

        url = series_url(series)
        if not dry_run:
            db_migrate_cmd.callback(db=db, series=None, raw_days=raw_days, series_days=series_days, layout=None,  # type: ignore[misc]
                                    dry_run=False)  # fmt: skip
        compact_ledger(db, url, series_days, dry_run)
        return
    if dry_run and not series:
        raise click.UsageError("--dry-run says what --series would copy: give --series URL")
    if series:
        from gpuledger.cli.db_tier import tier_existing_days

        if not dry_run:
            db_migrate_cmd.callback(db=db, series=None, raw_days=raw_days, series_days=series_days, layout=None,  # type: ignore[misc]
                                    dry_run=False)  # fmt: skip
        tier_existing_days(db, series, raw_days, series_days, dry_run)
        return
    database = Database(db)
    try:
        before = database.read(migrations.current_version)
        after = migrations.upgrade(database)
    finally:
        database.close()
    if after == before:
        click.echo(f"{database.display}: schema version {after}, nothing to do")
    else:
        click.echo(f"{database.display}: migrated from version {before} to {after}")


@db_group.command("status")
@db_required
@format_option("table", "json")
@cli_errors
def db_status_cmd(db: str | None, fmt: str) -> None:
    """The schema version of the ledger and the migrations still to apply (exit 1 if any)."""
    from gpuledger.store import migrations
    from gpuledger.store.engine import Database

    if not db:
        raise click.UsageError("give the database with --db URL (or GPULEDGER_DB)")
    check_ledger_url(db)
    refuse_missing_ledger(db)
    database = Database(db)
    try:
        version = database.read(migrations.current_version)
    finally:
        database.close()
    pending = [m for m in migrations.MIGRATIONS if m.version > version]
    if fmt == "json":
        echo_json({"version": version, "latest": migrations.LATEST, "pending": [m.version for m in pending]})
    else:
        click.echo(f"{database.display}: schema version {version} (this gpuledger: {migrations.LATEST})")
        for m in pending:
            click.echo(f"  pending {m.version}: {m.description}")
        if pending:
            click.echo("apply with: gpuledger db migrate --db URL")
    if pending:
        sys.exit(1)


@click.command("sync")
@click.option("--server", envvar="GPULEDGER_SERVER", metavar="URL", required=True, help="The team server.")
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    callback=token_file_given,
    help="Default: GPULEDGER_TOKEN.",
)
@click.option("--all", "all_runs", is_flag=True, help="Also push local runs recorded without --server.")
@click.option("--retry", is_flag=True, help="Try again runs the server refused before.")
@click.option("--status", "show_status", is_flag=True, help="Only show the outbox, push nothing.")
@click.option(
    "--forget",
    is_flag=True,
    help="Stop pushing capacity to --server: drop its capacity outbox, so retention no longer keeps "
    "intervals only it lacks (audited; asks first unless --yes).",
)
@click.option("--yes", is_flag=True, help="Do not ask before --forget.")
@click.option("--db", envvar="GPULEDGER_DB", metavar="URL", help="The local ledger (default: the user's).")
@cli_errors
def sync_cmd(
    server: str, token_file: str | None, all_runs: bool, retry: bool, show_status: bool, forget: bool, yes: bool,
    db: str | None,
) -> None:  # fmt: skip
    """Push runs kept in the local ledger's outbox (recorded while the server was away)."""
    from gpuledger.agent.client import Client, ServerError, Unauthorized, normalise_server, token_from
    from gpuledger.agent.sync import sync
    from gpuledger.cli.common import open_ledger
    from gpuledger.recorder.spool import waiting
    from gpuledger.store import capacity_push, pushes

    ledger = open_ledger(db, create=True)  # it keeps the outbox state
    server = normalise_server(server)
    if forget:
        _forget_capacity(ledger, server, yes)
        return
    spooled = waiting(servers=show_status)
    if show_status:
        from gpuledger.agent.outbox import FAILED
        from gpuledger.store import quarantine

        refused_rows = quarantine.for_server(ledger, server)
        states = pushes.all_states(ledger, server)
        for s in states:
            error = s.last_error or ""
            state = "done" if s.done else ("refused" if error.startswith(pushes.REJECTED) else "pending")
            state = "failed" if state == "pending" and error.startswith(FAILED) else state
            click.echo(f"{s.run_id}  {state}" + (f"  {s.last_error}" if s.last_error else ""))
            if s.run_id in spooled:
                click.echo(f"    waits in the spool ({spooled[s.run_id].path}): write it with gpuledger recover")
            for row in refused_rows.get(s.run_id, []):
                click.echo(f"    quarantined by the server: {row['series']} {row['item']}: {row['reason']}")
        known = {s.run_id for s in states}
        for run_id, spool in spooled.items():  # the ledger may have been locked before the outbox knew it
            if run_id not in known and server in spool.servers:
                click.echo(f"{run_id}  spooled  {spool.path}: write it with gpuledger recover")
        for box in capacity_push.outbox(ledger, server):
            click.echo(f"capacity  {_lacking(box)}")
        return
    with Client(server, token_from(None, token_file)) as client:
        try:
            report = sync(ledger, client, all_runs=all_runs, retry_rejected=retry, progress=click.echo, spooled=spooled)
        except Unauthorized as exc:  # trying again later sends the same token: it is the token to fix
            raise click.ClickException(f"{exc}; nothing is lost: fix the token, then run gpuledger sync") from exc
        except ServerError as exc:
            raise click.ClickException(f"{exc}; nothing is lost: run gpuledger sync again later") from exc
    from gpuledger.core.units import fmt_count

    left = len(pushes.pending(ledger, server))
    click.echo(
        f"pushed {fmt_count(report.rows, 'row')} of {fmt_count(report.pushed_runs, 'run')} in "
        f"{fmt_count(report.batches, 'batch', 'batches')}; "
        f"{fmt_count(len(report.done), 'run')} complete, {left} still in the outbox"
        + (f", {len(report.rejected)} refused (see --status; fix and --retry)" if report.rejected else "")
        + (f", {len(report.forbidden)} not allowed with this token" if report.forbidden else "")
        + (f", {len(report.failed)} failed (see --status)" if report.failed else "")
        + (f", {len(report.spooled)} waiting in the spool (gpuledger recover)" if report.spooled else "")
    )
    if report.rejected or report.forbidden or report.failed:
        sys.exit(1)


def _lacking(box: Outbox) -> str:
    from gpuledger.core.units import fmt_count

    if not box.unacknowledged:
        return f"nothing pending ({fmt_count(box.gpus_acknowledged, 'GPU')} acknowledged)"
    oldest = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime((box.oldest_t0_ms or 0) / 1000))
    last = (
        "never acknowledged anything"
        if box.last_acknowledged_at is None
        else "last acknowledged " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(box.last_acknowledged_at))
    )
    return f"{fmt_count(box.unacknowledged, 'interval')} pending, the oldest from {oldest}; {last}"


def _forget_capacity(ledger: Ledger, server: str, yes: bool) -> None:
    """``sync --forget``: the server is no longer pushed to; retention stops keeping data for it."""
    from gpuledger.cli.admin_cmds import _actor
    from gpuledger.store import capacity_push

    found = capacity_push.outbox(ledger, server)
    if not found:
        raise click.ClickException(f"this ledger does not push capacity to {server}; nothing to forget")
    box = found[0]
    if box.unacknowledged and not yes:
        click.confirm(f"{server} lacks {_lacking(box)}. Forget it, so retention may delete them?", abort=True, err=True)
    capacity_push.forget(ledger, server, actor=_actor())
    click.echo(f"forgot {server}: its capacity outbox is dropped ({_lacking(box)}); the audit trail records it")
