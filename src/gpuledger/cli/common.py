"""Options and helpers shared by the commands, and the one way a user's mistake becomes an error line.

Exit codes follow click: 2 for a usage error (a bad option or argument, caught before any work),
1 for a failure (an unknown run, an unreachable ledger, a broken rate card, a missing extra).
Either way the user sees one ``Error: ...`` message, never a traceback: commands raise the
exceptions their layers define, and ``friendly`` turns those into click's exceptions (the
``cli_errors`` decorator on a command, and the top-level group for every command).
"""

from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def friendly(exc: BaseException) -> click.ClickException | None:
    """The one-line error for an exception a user can cause, or None for one that is a bug."""
    from gpuledger.core.pricing.ratecard_load import RateCardError
    from gpuledger.extras import MissingExtra
    from gpuledger.store.errors import LedgerError

    if isinstance(exc, LedgerError | MissingExtra):
        return click.ClickException(str(exc))
    if isinstance(exc, RateCardError):
        problems = str(exc)  # one problem on the Error: line itself, several listed below it
        return click.ClickException("the rate card has problems:" + ("\n" if "\n" in problems else " ") + problems)
    return None


def cli_errors(func: F) -> F:
    """Turn the errors ``friendly`` knows into click's one-line errors (exit 1)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except Exception as exc:
            translated = friendly(exc)
            if translated is None:
                raise
            raise translated from exc

    return wrapper  # type: ignore[return-value]


def db_option(func: F) -> F:
    return click.option(
        "--db",
        envvar="GPULEDGER_DB",
        metavar="URL",
        help="Ledger: an SQLAlchemy URL or a file path (default: SQLite in the user data directory).",
    )(func)


def format_option(*choices: str, default: str = "table") -> Callable[[F], F]:
    """``--format CHOICE`` and ``--json`` (the same as ``--format json``): every read command takes
    both, so scripts written for either spelling keep working. The command receives ``fmt``."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            as_json = kwargs.pop("as_json")
            if as_json:
                source = click.get_current_context().get_parameter_source("fmt")
                if source is click.core.ParameterSource.COMMANDLINE and kwargs["fmt"] != "json":
                    raise click.UsageError(f"--json and --format {kwargs['fmt']} contradict each other: give one")
                kwargs["fmt"] = "json"
            return func(*args, **kwargs)

        wrapper = click.option("--json", "as_json", is_flag=True, help="Print JSON (the same as --format json).")(
            wrapper
        )
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(list(choices)),
            default=default,
            show_default=True,
            help="Output format.",
        )(wrapper)  # type: ignore[return-value]

    return decorate


class FiniteFloat(click.FloatRange):
    """A FloatRange that also refuses nan and inf (which compare false with any bound)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def check_ledger_url(url: str | None, param_hint: str = "--db") -> None:
    """Refuse a ledger URL that can never work (not a URL, an unsupported database, a driver that
    is not installed) before anything starts; a server that is down is not refused (a run keeps its
    record in the spool until it is back)."""
    from gpuledger.store import LedgerError, default_url
    from gpuledger.store.engine import Database

    try:
        Database(url or default_url()).close()
    except LedgerError as exc:
        raise click.BadParameter(str(exc), param_hint=param_hint) from exc


def parse_labels(items: Iterable[str], param_hint: str = "--label") -> dict[str, str]:
    from gpuledger.recorder.metadata import parse_label

    labels: dict[str, str] = {}
    for item in items:
        try:
            key, value = parse_label(item)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=param_hint) from exc
        # Refused, not guessed: an empty value is a label no run has, a repeated key would keep
        # whichever came last and drop the other without a word.
        if not value:
            raise click.BadParameter(f"label {key!r} has an empty value: give {key}=VALUE", param_hint=param_hint)
        if key in labels and labels[key] != value:
            raise click.BadParameter(
                f"label {key!r} is given twice ({key}={labels[key]} and {key}={value}): give it once",
                param_hint=param_hint,
            )
        labels[key] = value
    return labels


def include_replayed_option(func: F) -> F:
    """``--include-replayed``: shared by the chargeback, the capacity report and query gpu-hours."""
    return click.option(
        "--include-replayed",
        is_flag=True,
        help="Count runs metered from a replayed GPU trace (--replay-gpus demos), marked replayed. "
        "Default: left out, as they used no real GPU.",
    )(func)


def named(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A filter (``--project``, ``--team``, ``--user``; repeatable or not) given empty would match
    no run and answer "nothing": refused as ``run`` refuses an empty ``--project``."""
    for given in value if isinstance(value, tuple) else (value,):
        if given is not None and not given.strip():
            raise click.BadParameter("is empty: give a name, or leave the option out")
    return value


def labels_with(items: Iterable[str], project: str | None, team: str | None) -> dict[str, str]:
    """``--label``s with ``--project`` and ``--team`` added (run, import): an empty project or team,
    or one that contradicts a ``--label project=...``, is refused like a bad label."""
    labels = parse_labels(items)
    for key, given in (("project", project), ("team", team)):
        if given is None:
            continue
        if not given.strip():
            raise click.BadParameter("is empty: give a name, or leave the option out", param_hint=f"--{key}")
        given = given.strip()
        if labels.get(key, given) != given:
            raise click.BadParameter(
                f"--label {key}={labels[key]} and --{key} {given} contradict each other: give one",
                param_hint=f"--{key}",
            )
        labels[key] = given
    return labels


def refuse_missing_ledger(url: str) -> None:
    """A SQLite file that is not there is a mistyped path for a command that only reads: say so
    (exit 1) rather than create an empty ledger there and answer from it."""
    from gpuledger.store.url import parse, sqlite_path

    path = sqlite_path(parse(url))
    if path is not None and not path.exists():
        raise click.ClickException(
            f"no ledger at {path}: check --db / GPULEDGER_DB (gpuledger run, import and db migrate create one)"
        )


def open_ledger(url: str | None, create: bool = False):  # type: ignore[no-untyped-def]
    """The ledger at ``url``: a URL that can never work is a usage error (exit 2), a ledger that
    cannot be reached or read a failure (exit 1). A ledger named with --db or GPULEDGER_DB must
    exist unless ``create`` (a command that writes runs); the default one is created on first use."""
    from os import environ

    from gpuledger.store import Ledger, LedgerError

    check_ledger_url(url)
    if url and not create:
        refuse_missing_ledger(url)
    try:
        # a series store raw days were tiered into: a run's intervals read whole (store/series_read.py)
        return Ledger(url, series=environ.get("GPULEDGER_SERIES") or None)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc


def resolve_run(ledger, ref: str | None) -> str:  # type: ignore[no-untyped-def]
    """The full id of RUN (full id, short id or unique prefix), or of the newest run when RUN is omitted."""
    if ref is not None:
        return ledger.resolve(ref)
    newest = ledger.list_runs(limit=1)
    if not newest:
        raise click.ClickException("no runs yet: record one with gpuledger run -- COMMAND")
    return newest[0].id


def rate_card(path: str | None):  # type: ignore[no-untyped-def]
    """The rate card at ``path`` (None: the example card); a broken card is an error naming file and line."""
    from gpuledger.reports.cost.costing import load_rate_card

    return load_rate_card(path)


def check_report_rate_card(with_cost: bool) -> None:
    """Reports price runs with ``$GPULEDGER_RATES``: a broken card there is refused exactly as
    ``gpuledger cost`` refuses it, instead of quietly leaving the money out."""
    import os

    if with_cost:
        rate_card(os.environ.get("GPULEDGER_RATES") or None)


def echo_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
