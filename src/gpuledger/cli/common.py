"""Options and helpers shared by the commands."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def db_option(func: F) -> F:
    return click.option(
        "--db",
        envvar="GPULEDGER_DB",
        metavar="URL",
        help="Ledger: an SQLAlchemy URL or a file path (default: SQLite in the user data directory).",
    )(func)


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    from gpuledger.recorder.metadata import parse_label

    labels = {}
    for item in items:
        try:
            key, value = parse_label(item)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--label") from exc
        labels[key] = value
    return labels


def open_ledger(url: str | None):
    from gpuledger.store import Ledger, LedgerError

    try:
        return Ledger(url)
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc


def echo_json(obj: object) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
