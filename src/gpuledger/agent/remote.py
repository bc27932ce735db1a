"""Reading from a team server for the CLI (``gpuledger runs --server``)."""

from __future__ import annotations

from typing import Any

import click

from gpuledger.agent.client import Client, ServerError, token_from


def list_remote_runs(server: str, token_file: str | None, **filters: Any) -> list[dict[str, Any]]:
    """The server's run rows (the same keys as ``gpuledger runs --json``), or a ClickException."""
    with Client(server, token_from(None, token_file), timeout_s=30.0) as client:
        try:
            return client.list_runs(**filters)
        except ServerError as exc:
            raise click.ClickException(str(exc)) from exc


def nothing_visible(server: str, token_file: str | None) -> str:
    """What ``runs --server`` says when the caller sees no run and gave no filter: a member whose
    projects hold none is told so, not "no runs yet", when the server holds runs of others (the
    server says only whether it holds any run, nothing of whose)."""
    with Client(server, token_from(None, token_file), timeout_s=30.0) as client:
        try:
            me = client.me()
        except ServerError as exc:
            raise click.ClickException(str(exc)) from exc
    user = me.get("user") or "this token"
    if me.get("ledger_has_runs") is False:
        return f"no runs yet on {server}: record one with gpuledger run --server {server} -- COMMAND"
    if me.get("ledger_has_runs"):
        return f"no runs visible to {user} (the server holds runs of other teams or projects)"
    return f"no runs visible to {user} on {server}"  # a server too old to say whether it holds any
