"""Signing the audit chain as it is written: the writer's key, and vouching for the head.

Every process that appends to a team ledger's audit trail (``gpuledger serve``, ``gpuledger
admin``, ``gpuledger retention``, ``gpuledger audit seal``) signs each row it writes with the key
given by ``GPULEDGER_AUDIT_KEY_FILE`` (a file) or ``GPULEDGER_AUDIT_KEY`` (the key text);
``GPULEDGER_AUDIT_TRUSTED_KEYS`` names a file of further public keys it trusts (the previous key
after a rotation). The key never enters the database.

Before a writer extends the chain it checks the head: the row it wrote itself last, or a row with
a good signature of a trusted key. A head that fails (rows appended with SQL, without the key) is
never built on silently: the writer scans back to the last good signature and appends a signed
``audit.unsigned_rows`` entry naming the rows in between, so they stay reported forever and are
never taken for real history. Because every writer does this, a good signature on the head
vouches for every row below it (docs/AUDIT.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit.signing import Keyring, KeyTextError, SigningKey, parse_private
from gpuledger.store import schema
from gpuledger.store.errors import LedgerError

ENV_KEY = "GPULEDGER_AUDIT_KEY"
ENV_KEY_FILE = "GPULEDGER_AUDIT_KEY_FILE"
ENV_TRUSTED = "GPULEDGER_AUDIT_TRUSTED_KEYS"
UNSIGNED_ROWS = "audit.unsigned_rows"
SIGNING_STARTED = "audit.signing_started"
_HEAD_INFO = "gpuledger_audit_head"  # conn.info: (seq, hash) of the last row this connection signed


class AuditKeyError(LedgerError):
    """The audit trail cannot be extended with the key (or lack of one) this process has."""


@dataclass(frozen=True)
class WriterKeys:
    signer: SigningKey
    trusted: Keyring  # the signer's own public key and GPULEDGER_AUDIT_TRUSTED_KEYS


_cache: dict[tuple[str | None, str | None, str | None], WriterKeys | None] = {}


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AuditKeyError(f"cannot read the {what} {path} ({exc.strerror or exc})") from None


def writer_keys() -> WriterKeys | None:
    """The signing key of this process (from the environment), or None when none is set."""
    env = (os.environ.get(ENV_KEY), os.environ.get(ENV_KEY_FILE), os.environ.get(ENV_TRUSTED))
    if env in _cache:
        return _cache[env]
    text, path, trusted_path = env
    found: WriterKeys | None = None
    if text or path:
        try:
            signer = parse_private(text if text else _read(path or "", f"audit key ({ENV_KEY_FILE})"))
            extra = Keyring.parse(_read(trusted_path, f"trusted keys ({ENV_TRUSTED})")) if trusted_path else None
        except KeyTextError as exc:
            raise AuditKeyError(f"{ENV_KEY if text else ENV_KEY_FILE}: {exc}") from None
        keys = [signer.public, *(extra.keys.values() if extra else ())]
        found = WriterKeys(signer, Keyring.of(keys))
    _cache[env] = found
    return found


@dataclass(frozen=True)
class Head:
    seq: int
    hash: str
    key_id: str | None
    sig: str | None


def head(conn: Connection) -> Head | None:
    a = schema.audit_log.c
    row = conn.execute(sa.select(a.seq, a.hash, a.key_id, a.sig).order_by(a.seq.desc()).limit(1)).first()
    return None if row is None else Head(int(row.seq), str(row.hash), row.key_id, row.sig)


def remember(conn: Connection, seq: int, row_hash: str) -> None:
    conn.info[_HEAD_INFO] = (seq, row_hash)


def last_trusted_seq(conn: Connection, keyring: Keyring, below: int) -> int:
    """The highest seq at or below ``below`` whose row carries a good signature of ``keyring``;
    0 when there is none (the chain was never signed with these keys)."""
    a = schema.audit_log.c
    q = sa.select(a.seq, a.hash, a.key_id, a.sig).where(a.seq <= below).order_by(a.seq.desc())
    result = conn.execute(q.execution_options(yield_per=1000))
    try:
        for row in result:
            if keyring.verify(int(row.seq), row.key_id, str(row.hash), row.sig):
                return int(row.seq)
        return 0
    finally:
        result.close()  # a server-side cursor: closed before the connection writes again


def trusted_head(conn: Connection, last: Head | None, keys: WriterKeys | None) -> tuple[int, int] | None:
    """Check the chain's head before extending it. None: build on it. ``(first, last)``: rows
    first..last were appended without a trusted key; the caller records them before anything else.
    Raises AuditKeyError when this process cannot tell (no key on a signed chain, an unknown key)."""
    if last is None:
        return None
    if keys is None:
        if last.key_id is not None:
            raise AuditKeyError(
                f"this ledger's audit trail is signed (key {last.key_id}); set {ENV_KEY_FILE} to the audit key "
                "to change anything in it (docs/AUDIT.md)"
            )
        return None
    if conn.info.get(_HEAD_INFO) == (last.seq, last.hash):
        return None  # this connection wrote and signed it
    if last.key_id is not None and last.key_id not in keys.trusted.keys:
        raise AuditKeyError(
            f"the audit trail's last row (seq {last.seq}) is signed by key {last.key_id}, which this process "
            f"does not trust; after a key rotation add the old public key to {ENV_TRUSTED} (docs/AUDIT.md), "
            "otherwise run `gpuledger audit verify`"
        )
    if keys.trusted.verify(last.seq, last.key_id, last.hash, last.sig):
        return None
    a = schema.audit_log.c
    if conn.scalar(sa.select(sa.func.count()).select_from(schema.audit_log).where(a.key_id.is_not(None))) == 0:
        raise AuditKeyError(
            f"this ledger's audit trail ({last.seq} rows) was written without a key; start signing it once with "
            "`gpuledger audit key start --db URL` (docs/AUDIT.md)"
        )
    good = last_trusted_seq(conn, keys.trusted, last.seq)
    return good + 1, last.seq
