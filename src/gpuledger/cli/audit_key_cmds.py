"""``gpuledger audit key new|public|start``: the audit trail's signing key (docs/AUDIT.md)."""

from __future__ import annotations

import os

import click

from gpuledger.cli.server_cmds import db_required, server_ledger


@click.group("key")
def key_group() -> None:
    """The Ed25519 key that signs the audit trail (it never enters the database)."""


@key_group.command("new")
@click.option(
    "--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Where to write the private key (0600)."
)
def key_new(out_path: str) -> None:
    """Make a signing key: the private key goes to --out, the public key to stdout (publish it:
    verifiers need only that)."""
    from gpuledger.core.audit.signing import SigningKey

    folder = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(folder):  # a usage error, as for every -o: said before any work
        raise click.BadParameter(f"the folder {folder} does not exist (make it: install -d -m 700)", param_hint="--out")
    key = SigningKey.generate()
    try:
        fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise click.ClickException(f"{out_path} exists; never overwrite a key (rotate: docs/AUDIT.md)") from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {out_path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"# gpuledger audit key {key.key_id}: keep it secret, outside the database\n{key.text}\n")
    click.echo(f"key {key.key_id} written to {out_path}; set GPULEDGER_AUDIT_KEY_FILE={out_path}", err=True)
    click.echo(key.public.text)


@key_group.command("public")
@click.option("--key-file", required=True, type=click.Path(exists=True, dir_okay=False))
def key_public(key_file: str) -> None:
    """Print the public key of a private key file."""
    from gpuledger.core.audit.signing import KeyTextError, parse_private

    try:
        with open(key_file, encoding="utf-8") as fh:
            key = parse_private(fh.read())
    except (KeyTextError, OSError) as exc:
        raise click.ClickException(f"{key_file}: {exc}") from exc
    click.echo(key.public.text)


@key_group.command("start")
@db_required
def key_start(db: str | None) -> None:
    """Start signing an audit trail written without a key (a ledger from before signing): one
    signed row that names the rows before it, which stay "hash chain only"."""
    from gpuledger.cli.admin_cmds import _actor
    from gpuledger.store import LedgerError, audit

    try:
        seq = audit.start_signing(server_ledger(db), actor=_actor())
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"signing started at audit seq {seq}; rows before it are hash chain only")
