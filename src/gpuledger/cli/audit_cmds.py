"""``gpuledger audit verify|seal|head`` and ``gpuledger retention run``."""

from __future__ import annotations

import os
import sys
import time

import click

from gpuledger.cli.admin_cmds import _account_errors, _actor
from gpuledger.cli.audit_key_cmds import key_group
from gpuledger.cli.common import FiniteFloat, cli_errors, echo_json, rate_card
from gpuledger.cli.server_cmds import db_required, server_ledger


def series_option(help_text: str):  # type: ignore[no-untyped-def]
    return click.option("--series", envvar="GPULEDGER_SERIES", metavar="URL", help=help_text)


series_days_option = click.option(
    "--series-days", type=click.IntRange(1), default=366, show_default=True, envvar="GPULEDGER_SERIES_DAYS",
    help="How long the series store keeps raw rows: retention run --series drops its whole days that began "
    "this long ago (ClickHouse: also its TTL); longer than --raw-days.",
)  # fmt: skip


def open_tier(url: str, series_days: int = 366, *, create: bool = True):  # type: ignore[no-untyped-def]
    """The series store --series names (created where missing, with ``create``): a URL that names
    none is a usage error (exit 2), a store that cannot be reached a failure (exit 1)."""
    from gpuledger.series.open import BadSeriesUrl
    from gpuledger.store.series_tier import Tier, shown_url

    try:
        return Tier.open(url, series_days=series_days, create=create)
    except BadSeriesUrl as exc:
        raise click.BadParameter(str(exc), param_hint="--series") from None
    except (ValueError, ImportError) as exc:
        raise click.BadParameter(f"{shown_url(url)}: {exc}", param_hint="--series") from None
    except Exception as exc:  # the store's own errors: unreachable, refused
        raise click.ClickException(f"--series {shown_url(url)}: {type(exc).__name__}: {exc}") from None


@click.group("audit")
def audit_group() -> None:
    """The signed, tamper-evident audit trail of a team ledger (docs/AUDIT.md)."""


audit_group.add_command(key_group)


def _keyring(values: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """The trusted keys: each value a key line or a file of them; none given: the environment's."""
    from gpuledger.core.audit.signing import Keyring, KeyTextError, parse_public
    from gpuledger.store import audit_sign

    keys = []
    try:
        for value in values:
            if os.path.isfile(value):
                with open(value, encoding="utf-8") as fh:
                    keys += list(Keyring.parse(fh.read()).keys.values())
            else:
                keys.append(parse_public(value))
    except (KeyTextError, OSError) as exc:
        raise click.ClickException(f"--public-key: {exc}") from exc
    if keys:
        return Keyring.of(keys)
    env = audit_sign.writer_keys()
    return env.trusted if env is not None else None


def _checkpoint(db: str | None, given: str | None):  # type: ignore[no-untyped-def]
    """The checkpoint to hold the chain to: the file given (which must exist), else the server's
    default one for this ledger when it is there."""
    from pathlib import Path

    from gpuledger.store import audit_checkpoint

    path = Path(given).expanduser() if given else audit_checkpoint.default_path(db or "")
    cp = audit_checkpoint.load(path)
    typed = click.get_current_context().get_parameter_source("checkpoint") == click.core.ParameterSource.COMMANDLINE
    if cp is None and typed:  # a file named on the command line must be there; the environment's may not be yet
        raise click.ClickException(f"--checkpoint {given}: no such file")
    return None if cp is None else (cp, str(path))


def _assurance(result) -> str:  # type: ignore[no-untyped-def]
    from gpuledger.store.audit_verify import ASSURANCE

    if result.assurance != "signed":
        keys = f" (key {', '.join(result.keys)})" if result.keys and result.assurance == "unchecked" else ""
        return f"assurance: {ASSURANCE[result.assurance]}{keys}"
    return (
        f"assurance: signed: rows up to seq {result.signed_through} are vouched for by a good signature "
        f"(keys used: {', '.join(result.keys)})"
    )


@audit_group.command("verify")
@db_required
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    metavar="KEY|FILE",
    help="A trusted audit key (ed25519:..., from `gpuledger audit key public`) or a file of them; repeatable. "
    "Default: the keys of GPULEDGER_AUDIT_KEY_FILE / GPULEDGER_AUDIT_TRUSTED_KEYS, if set.",
)
@click.option(
    "--expect-head", metavar="SEQ:HASH", help="A head recorded earlier (gpuledger audit head): must still be there."
)
@click.option("--all-signatures", is_flag=True, help="Check every row's signature too (slow), not only the head's.")
@click.option(
    "--checkpoint", envvar="GPULEDGER_AUDIT_CHECKPOINT", type=click.Path(dir_okay=False), metavar="FILE",
    help="The server's signed checkpoint: the chain must still reach it. Default: the one gpuledger serve keeps for "
    "this ledger on this machine, if any.",
)  # fmt: skip
@click.option(
    "--close-after-days", type=FiniteFloat(0, 3650), default=3.0, show_default=True,
    envvar="GPULEDGER_CLOSE_AFTER_DAYS",
    help="When months close, as the server has it: runs created after their month closed are named.",
)  # fmt: skip
@series_option(
    "The series store days were tiered into (gpuledger retention run --series): each must still hold "
    "exactly the rows the trail records (or GPULEDGER_SERIES)."
)
@click.option("--json", "as_json", is_flag=True)
@_account_errors
def verify_cmd(
    db: str | None, public_keys: tuple[str, ...], expect_head: str | None, all_signatures: bool,
    checkpoint: str | None, close_after_days: float, series: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Check the signatures, the hash chain, every sealed run and the access, ownership and rollup
    tables against the audit trail, and that nothing was cut from its end since the checkpoint;
    with --series, that the series store still holds every tiered day; name each row that differs.
    Exit 1 on any."""
    from gpuledger.store import audit

    keyring = _keyring(public_keys)
    ledger = server_ledger(db)
    result = audit.verify(ledger, expect_head=expect_head, keyring=keyring, all_signatures=all_signatures,
                          checkpoint=_checkpoint(db, checkpoint), close_after_days=close_after_days)  # fmt: skip
    if series:
        from gpuledger.store import series_verify

        tier = open_tier(series, create=False)  # a check changes nothing, not even a TTL
        try:
            found = series_verify.check(ledger, tier.store, series)
        except Exception as exc:  # the store's own errors: a table gone, unreachable
            raise click.ClickException(f"--series {tier.url}: {type(exc).__name__}: {exc}") from None
        finally:
            tier.store.close()
        result.problems += found.problems
        checked = (
            f"{found.days_checked} tiered run days checked, {found.runs_checked} series-only runs checked, "
            f"{found.capacity_checked} tiered capacity host days checked"
        )
        result.notes += [*found.notes, f"series store {tier.url}: {checked}"]
    if as_json:
        echo_json({**result.__dict__, "ok": result.ok})
    else:
        for line in result.problems:
            click.echo(f"TAMPERED  {line}")
        for line in result.since_head:
            click.echo(f"SINCE HEAD  {line}")
        for line in result.notes:
            click.echo(f"NOTE  {line}")
        capacity = ""
        if result.capacity_sealed_through is not None:
            capacity = (
                f", {result.capacity_days_checked} capacity GPU-days checked (sealed through "
                f"{result.capacity_sealed_through})"
            )
        click.echo(
            f"{'OK' if result.ok else 'FAILED'}: {result.rows} audit rows, {result.runs_checked} sealed runs checked, "
            f"{result.unsealed_running} running{capacity}; head {result.head_seq}:{result.head_hash}"
        )
        click.echo(_assurance(result))
    if not result.ok:
        sys.exit(1)


@audit_group.command("head")
@db_required
@_account_errors
def head_cmd(db: str | None) -> None:
    """Print the chain's head as SEQ:HASH: keep it outside the database (e.g. daily, in a ticket
    or a git repo); ``verify --expect-head`` then also catches a truncated chain and lists every
    seal made since."""
    from gpuledger.store import audit_sign

    found = server_ledger(db).read(audit_sign.head)
    click.echo("0:" + "0" * 64 if found is None else f"{found.seq}:{found.hash}")


def _run_line(d: dict) -> str:  # type: ignore[type-arg]
    import datetime as dt

    def when(t: float | None) -> str:
        return "-" if t is None else dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M")

    busy = "-" if d["busy_s"] is None else f"{d['busy_s'] / 3600:.2f} busy GPU-h"
    return (
        f"{d['id']}  {d['status']:<9} {d['user']} on {d['host']}, project {d['project'] or '-'}, "
        f"{when(d['started_at'])} to {when(d['ended_at'])} UTC, {d['gpu_intervals']} GPU intervals, {busy}"
    )


@audit_group.command("seal")
@db_required
@click.option("--yes", is_flag=True, help="Approve what is listed: seal those runs, record those rollups.")
@click.option("--run", "runs", multiple=True, metavar="RUN_ID", help="Approve only this run (repeatable).")
@click.option(
    "--adopt", multiple=True, metavar="RUN_ID", help="Approve a run written outside gpuledger (after checking it)."
)
@_account_errors
def seal_cmd(db: str | None, yes: bool, runs: tuple[str, ...], adopt: tuple[str, ...]) -> None:
    """An admin's approval: list what the trail does not vouch for (finished runs never sealed,
    runs written outside gpuledger, rollups from before they were audited); with --yes / --run /
    --adopt, seal exactly that, in your name. Needs the audit key on a signed ledger."""
    from gpuledger.store import audit_approve

    ledger = server_ledger(db)
    todo = audit_approve.pending(ledger)
    if not (yes or runs or adopt):
        for d in todo.unsealed:
            click.echo(f"UNSEALED  {_run_line(d)}")
        for d in todo.foreign:
            click.echo(f"FOREIGN   {_run_line(d)}  (no run.created entry: approve one by one with --adopt)")
        for run_id in todo.rollups:
            click.echo(f"ROLLUPS   {run_id}  (rolled up before rollups were audited)")
        click.echo(
            f"{len(todo.unsealed)} finished runs never sealed, {len(todo.foreign)} runs written outside gpuledger, "
            f"{len(todo.rollups)} runs with unaudited rollups. Nothing was changed: check them, then approve with "
            "--yes (the unsealed runs and rollups listed), --run RUN_ID or --adopt RUN_ID."
        )
        return
    chosen = list(runs) or ([d["id"] for d in todo.unsealed] if yes else [])
    for line in audit_approve.approve(ledger, actor=_actor(), runs=chosen, adopt=list(adopt), rollups=yes):
        click.echo(line)


def _window_line(w) -> str:  # type: ignore[no-untyped-def]
    """What retention did to the tier store (store/series_window.py), in one line."""
    days = w.dropped if len(w.dropped) <= 6 else [w.dropped[0], "...", w.dropped[-1]]
    dropped = f"{len(w.dropped)} days before {w.before} dropped ({', '.join(days)})" if w.dropped else (
        f"no day before {w.before} to drop")  # fmt: skip
    made = f"; {len(w.made)} day partitions and indexes made" if w.made else ""
    return f"series store {w.url}: {dropped}{made}"


@click.group("retention")
def retention_group() -> None:
    """Roll old intervals up, delete old logs (and runs, if asked)."""


@retention_group.command("run")
@db_required
@click.option("--raw-days", type=FiniteFloat(0), default=7.0, show_default=True, help="Keep raw intervals this long.")
@click.option(
    "--minute-days",
    type=FiniteFloat(0),
    default=90.0,
    show_default=True,
    help="Then 1-minute intervals this long; 1-hour ones after.",
)
@click.option(
    "--log-days",
    type=FiniteFloat(0),
    default=90.0,
    show_default=True,
    help="Delete logs of runs ended longer ago.",
)
@click.option("--keep-logs", is_flag=True, help="Never delete logs.")
@click.option(
    "--drop-partitions/--rewrite-intervals",
    default=None,
    help="PostgreSQL: drop whole days of raw intervals older than --raw-days (their day partitions), "
    "instead of rewriting them as 1-minute and 1-hour intervals; runs keep their cost rollups and seals. "
    "Default: drop them where a series store keeps their curves (--series or GPULEDGER_SERIES on a "
    "PostgreSQL ledger), rewrite them otherwise.",
)
@series_option(
    "Copy each day into this series store (chdb:///folder, clickhouse://..., postgresql://...?schema=NAME), "
    "read it back and check it before its partition is dropped; reads of a run then merge it back "
    "(or GPULEDGER_SERIES). PostgreSQL ledgers."
)
@series_days_option
@click.option("--run-days", type=FiniteFloat(0), help="Delete whole runs ended longer ago (default: never).")
@click.option(
    "--capacity-days",
    type=FiniteFloat(0),
    default=90.0,
    show_default=True,
    help="Delete the fleet's raw capacity intervals older than this (their day sums are kept); "
    "with --series, copied into the series store and checked first.",
)
@click.option("--keep-capacity", is_flag=True, help="Never delete raw capacity intervals.")
@click.option(
    "--rates", envvar="GPULEDGER_RATES", type=click.Path(dir_okay=False),
    help="Rate card TOML whose price changes no rolled-up interval straddles, so reports priced with it stay "
    "exact (docs/RATE_CARDS.md; or GPULEDGER_RATES). Default: the example card.",
)  # fmt: skip
@_account_errors
@cli_errors
def retention_run_cmd(
    db: str | None, raw_days: float, minute_days: float, log_days: float, keep_logs: bool,
    drop_partitions: bool | None,
    series: str | None, series_days: int, run_days: float | None, capacity_days: float, keep_capacity: bool,
    rates: str | None,
) -> None:  # fmt: skip
    """Apply the retention policy once (schedule it daily, e.g. with cron or a systemd timer)."""
    from gpuledger.store.retention import Policy, run_retention

    card = rate_card(rates or None)  # a broken card is refused before anything is rewritten

    try:
        from gpuledger.reports.cost.rollups import materialise_rollups
    except ImportError:
        materialise_rollups = None  # type: ignore[assignment]
    ledger = server_ledger(db)
    postgres = ledger.dialect == "postgresql"
    if drop_partitions and not postgres:
        raise click.ClickException(
            "--drop-partitions is for PostgreSQL ledgers (day partitions); SQLite keeps rewriting old intervals "
            "as 1-minute and 1-hour rollups: leave the option out"
        )
    typed = click.get_current_context().get_parameter_source("series") == click.core.ParameterSource.COMMANDLINE
    if series and typed and drop_partitions is False:
        raise click.UsageError("--series tiers the days it drops: it cannot be given with --rewrite-intervals")
    if series and typed and not postgres:
        raise click.UsageError("--series tiers a PostgreSQL ledger's day partitions; SQLite keeps rewriting")
    if drop_partitions is None:  # the curves are kept in the store: no reason to thin them to minutes
        drop_partitions = bool(series) and postgres
    policy = Policy(
        raw_days, max(minute_days, raw_days), None if keep_logs else log_days, run_days,
        None if keep_capacity else capacity_days, drop_partitions,
    )  # fmt: skip
    if series and drop_partitions and series_days <= raw_days:  # it would drop the days just tiered
        raise click.BadParameter(
            f"{series_days} days is not longer than --raw-days {raw_days:g}", param_hint="--series-days"
        )
    tier = open_tier(series, series_days) if series and drop_partitions else None
    try:
        report = run_retention(
            ledger, policy, actor=_actor(), cost_rollups=materialise_rollups, price_changes=card.change_points,
            tier=tier,
        )  # fmt: skip
    finally:
        if tier is not None:
            tier.store.close()
    levels = ", ".join(f"{n} runs to {lvl} s" for lvl, n in sorted(report.rolled_up.items())) or "nothing"
    click.echo(
        f"rolled up {levels} ({report.rows_before} -> {report.rows_after} interval rows); "
        f"{report.logs_deleted} logs and {report.runs_deleted} runs deleted"
    )
    if report.capacity is not None and (report.capacity.rows or report.capacity.kept_unpushed):
        cut = time.strftime("%Y-%m-%d", time.gmtime(report.capacity.cut_ms / 1000))
        kept = report.capacity.kept_unpushed
        held = f"; {kept} kept until a team server acknowledges them" if kept else ""
        into = f", tiered into {tier.url} first" if tier is not None else ""
        click.echo(f"capacity: {report.capacity.rows} raw intervals before {cut} deleted (day sums kept){into}{held}")
    if report.capacity is not None and report.capacity.days_dropped:  # PostgreSQL: whole day partitions
        click.echo(f"capacity days dropped as partitions: {', '.join(report.capacity.days_dropped)}")
    for day, why in ({} if report.capacity is None else report.capacity.days_kept).items():
        click.echo(f"kept capacity of {day}: {why}")
    untiered = {} if report.capacity is None else report.capacity.untiered
    for host, why in untiered.items():
        click.echo(f"KEPT capacity of host {host}: the series store does not hold it exactly: {why}", err=True)
    if report.days is not None:
        into = f", tiered into {tier.url} first" if tier is not None else ""
        click.echo(f"raw intervals: {len(report.days.dropped)} days dropped ({report.days.rows} rows){into}"
                   + "".join(f"\nkept {day}: {why}" for day, why in report.days.kept.items()))  # fmt: skip
    if report.series is not None:
        click.echo(_window_line(report.series))
    for run_id, why in report.skipped.items():
        click.echo(f"SKIPPED {run_id}: {why}", err=True)
    if report.skipped or untiered:
        sys.exit(1)
