"""What ``gpuledger serve`` checks about the audit trail before it listens (docs/SERVER.md,
"Deploying"): a signed ledger needs its key, the key file is the owner's alone, running unsigned
is chosen with ``--unsigned``, and the chain still reaches the checkpoint kept outside the
database (store/audit_checkpoint.py). Each refusal is one message that names the fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import click
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import Ledger, LedgerError, audit_checkpoint, audit_sign, schema


def _signed(conn: Connection) -> str | None:
    """The key id of a signed row, if the trail has any (a signed ledger)."""
    a = schema.audit_log.c
    return conn.scalar(sa.select(a.key_id).where(a.key_id.is_not(None)).limit(1))


def check_key_file() -> None:
    """Like ssh: a private key others may read is refused, with the chmod that fixes it."""
    path = os.environ.get(audit_sign.ENV_KEY_FILE)
    if not path or os.environ.get(audit_sign.ENV_KEY):
        return  # the key text in the environment wins (store/audit_sign.py)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # writer_keys() says why it cannot be read
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise click.ClickException(
            f"the audit key file {path} can be read by others (mode {stat.S_IMODE(mode):04o}): whoever reads it can "
            f"sign history. Fix: chmod 600 {path} (and keep it from the database's operators; docs/AUDIT.md)"
        )


def check(ledger: Ledger, db: str, *, unsigned: bool, checkpoint: Path) -> str:
    """Refuse to serve what cannot be served safely; the line to print when all is well."""
    check_key_file()
    try:
        keys = audit_sign.writer_keys()  # a key file that cannot be read fails here, not at the first push
    except LedgerError as exc:
        raise click.ClickException(str(exc)) from exc
    signed_by = ledger.read(_signed)
    if keys is not None and unsigned:
        raise click.ClickException(
            f"--unsigned, but an audit key is set ({audit_sign.ENV_KEY_FILE} or {audit_sign.ENV_KEY}): choose one"
        )
    if keys is None and signed_by is not None:
        raise click.ClickException(
            f"this ledger's audit trail is signed (key {signed_by}), and this process has no audit key: every write "
            f"would fail. Set {audit_sign.ENV_KEY_FILE} to the audit key file (docs/AUDIT.md, 'The key')"
        )
    if keys is None and not unsigned:
        raise click.ClickException(
            f"no audit key: set {audit_sign.ENV_KEY_FILE} to a key made with `gpuledger audit key new --out FILE` "
            "(docs/AUDIT.md), or pass --unsigned to run with a hash chain only, which anyone with write access to "
            "the database could rewrite unnoticed"
        )
    if keys is None:
        return "gpuledger: --unsigned: the audit trail is a hash chain only, not signed (docs/AUDIT.md)"
    _check_checkpoint(ledger, db, keys, checkpoint)
    return f"gpuledger: the audit trail is signed with key {keys.signer.key_id}; checkpoint {checkpoint}"


def _check_checkpoint(ledger: Ledger, db: str, keys: audit_sign.WriterKeys, path: Path) -> None:
    try:
        cp = audit_checkpoint.load(path)
    except LedgerError as exc:
        raise click.ClickException(f"{exc}; move it away only if you know why it changed") from exc
    if cp is None:
        return  # a first start: the server writes it from now on
    if not cp.trusted_by(keys.trusted):
        raise click.ClickException(
            f"the audit checkpoint {path} is not signed by a key this server trusts (key {cp.key_id}): it was "
            f"changed by hand, or is another ledger's. After a key rotation add the old public key to "
            f"{audit_sign.ENV_TRUSTED}; otherwise check the ledger with `gpuledger audit verify` (docs/AUDIT.md)"
        )
    why = ledger.read(lambda conn: audit_checkpoint.problem(conn, cp))
    if why is not None:
        raise click.ClickException(audit_checkpoint.refusal(why, path, ledger.url))
    audit_checkpoint.set_floor(ledger.database.engine, cp, path)
