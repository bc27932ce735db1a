"""``--token-file``: a file with no token on its first line is a usage error, found before any work.

Without this check an empty file (a ``gpuledger admin token issue ... > FILE`` that failed) sent no
token, and the server's 401 "missing token ... (check GPULEDGER_TOKEN)" pointed away from the file.
"""

from __future__ import annotations

import click


def token_file_given(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: ``value`` unchanged when its first line holds a token, else a BadParameter."""
    if value is None:
        return None
    try:
        with open(value, encoding="utf-8") as fh:
            first = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {value}: {exc}", ctx=ctx, param=param) from None
    if not first:
        raise click.BadParameter(
            f"{value} holds no token on its first line (put one there: gpuledger admin token issue ... > {value})",
            ctx=ctx,
            param=param,
        )
    return value
