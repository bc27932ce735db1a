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
