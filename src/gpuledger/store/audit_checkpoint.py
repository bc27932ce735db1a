"""A signed checkpoint of the audit chain's head, kept outside the database (docs/AUDIT.md).

A good signature on the chain's last row vouches for every row below it, but not for the rows
that are no longer there: deleting rows from the end (a ``token.revoked`` among them) or
restoring an older backup leaves a shorter chain whose last row is still properly signed. So the
server remembers the highest signed head it has seen in a file, signed with the audit key:

    {"format": "gpuledger-audit-checkpoint-v1", "ledger": URL, "seq": N, "hash": H, "key_id": K,
     "t": T, "sig": S}

``gpuledger serve`` writes it as the chain grows (store on a timer: server/checkpoint_keeper.py)
and at shutdown, refuses to start on a chain below it, and refuses to append to one while it
runs; ``gpuledger audit verify`` reads it and names a shortened or replaced chain. The file holds
no secret: publish it, like ``gpuledger audit head``. It is written atomically and never lowered
(several workers share one file).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import Pool

from gpuledger.core.audit.signing import Keyring, SigningKey
from gpuledger.paths import data_dir
from gpuledger.store import audit_sign, schema
from gpuledger.store.errors import LedgerError
from gpuledger.store.url import display_url

FORMAT = "gpuledger-audit-checkpoint-v1"
ENV_PATH = "GPULEDGER_AUDIT_CHECKPOINT"
_FIELDS = ("seq", "hash", "key_id", "t", "sig")


class CheckpointError(LedgerError):
    """A checkpoint file that cannot be read or trusted."""


class ChainShortened(LedgerError):
    """The chain in the database is below (or beside) the checkpoint: rows were removed from its
    end, or an older backup was restored. Nothing may be appended to it."""


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    hash: str
    key_id: str
    t: float  # when it was written (Unix seconds)
    sig: str
    ledger: str = ""  # the database it is of, for a reader (display URL, no password)

    def text(self) -> bytes:
        """What the signature covers."""
        return f"{FORMAT}|{self.key_id}|{self.seq}|{self.hash}|{self.t:.3f}".encode()

    def trusted_by(self, keyring: Keyring) -> bool:
        key = keyring.keys.get(self.key_id)
        return key is not None and key.verify_text(self.text(), self.sig)

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.t))

    def describe(self) -> str:
        return f"seq {self.seq} (hash {self.hash[:12]}…, written {self.when})"


def sign(signer: SigningKey, seq: int, row_hash: str, *, ledger: str = "", t: float | None = None) -> Checkpoint:
    unsigned = Checkpoint(seq, row_hash, signer.key_id, round(time.time() if t is None else t, 3), "", ledger)
    return Checkpoint(seq, row_hash, signer.key_id, unsigned.t, signer.sign_text(unsigned.text()), ledger)


def default_path(url: str, env: Mapping[str, str] | None = None) -> Path:
    """``$GPULEDGER_AUDIT_CHECKPOINT``, else a file per ledger under the data dir."""
    env = os.environ if env is None else env
    if env.get(ENV_PATH):
        return Path(env[ENV_PATH]).expanduser()
    name = hashlib.sha256(display_url(url).encode()).hexdigest()[:16]
    return data_dir(env) / "audit-checkpoints" / f"{name}.json"


def load(path: Path) -> Checkpoint | None:
    """The checkpoint in ``path``; None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"cannot read the audit checkpoint {path} ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format is not {FORMAT!r}")
        return Checkpoint(int(doc["seq"]), str(doc["hash"]), str(doc["key_id"]), float(doc["t"]), str(doc["sig"]),
                          str(doc.get("ledger", "")))  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"the audit checkpoint {path} is not one gpuledger wrote ({exc})") from None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # workers of one server share the file: read, compare, write as one
        yield


def write(path: Path, cp: Checkpoint, keyring: Keyring) -> Checkpoint:
    """Store ``cp`` unless the file already holds a higher checkpoint of ``keyring``; returns the one kept."""
    with _locked(path):
        try:
            there = load(path)
        except CheckpointError:
            there = None  # a torn or foreign file: replaced by a good one
        if there is not None and there.seq >= cp.seq and there.trusted_by(keyring):
            return there
        doc = {"format": FORMAT, "ledger": cp.ledger, **{f: getattr(cp, f) for f in _FIELDS}}
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(doc, indent=1) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
        return cp


def problem(conn: Connection, cp: Checkpoint) -> str | None:
    """How the chain in the database fails the checkpoint; None when it still holds it."""
    head = audit_sign.head(conn)
    if head is None or head.seq < cp.seq:
        ends = "is empty" if head is None else f"ends at seq {head.seq} (hash {head.hash[:12]}…)"
        return (
            f"the audit trail {ends}, but the checkpoint says it reached {cp.describe()}: rows were removed "
            "from its end, or an older backup was restored"
        )
    there = head.hash if head.seq == cp.seq else _hash_at(conn, cp.seq)
    if there != cp.hash:
        return (
            f"the audit trail's row seq {cp.seq} has hash {str(there)[:12]}…, but the checkpoint says "
            f"{cp.describe()}: the chain was replaced (an older backup restored and written on since)"
        )
    return None


def _hash_at(conn: Connection, seq: int) -> str | None:
    a = schema.audit_log.c
    return conn.scalar(sa.select(a.hash).where(a.seq == seq))


# -- the floor of a writing process -----------------------------------------------------------------

# by the engine's pool: writes go through an option view of the engine (same pool, another object)
_floors: weakref.WeakKeyDictionary[Pool, tuple[Checkpoint, Path]] = weakref.WeakKeyDictionary()


def set_floor(engine: Engine, cp: Checkpoint, path: Path) -> None:
    """Appends through ``engine`` refuse a chain below ``cp`` from now on (checked by ``audit.append``)."""
    known = _floors.get(engine.pool)
    if known is None or known[0].seq < cp.seq:
        _floors[engine.pool] = (cp, path)


def guard_writer(engine: Engine, url: str) -> None:
    """For a writer other than the server (``gpuledger admin``, ``retention`` ...) on the server's
    host: hold appends to the checkpoint there, when there is a good one for this key."""
    try:
        keys = audit_sign.writer_keys()
        cp = load(default_path(url)) if keys is not None else None
    except LedgerError:
        return  # the command says what is wrong with the key when it writes; a bad file is the server's to refuse
    if keys is not None and cp is not None and cp.trusted_by(keys.trusted):
        set_floor(engine, cp, default_path(url))


def floor(engine: Engine) -> Checkpoint | None:
    known = _floors.get(engine.pool)
    return None if known is None else known[0]


def check_floor(conn: Connection, last: audit_sign.Head | None) -> None:
    """Before appending: refuse a chain below this process's checkpoint (one primary-key read
    when the head is not the checkpoint's row)."""
    known = _floors.get(conn.engine.pool)
    if known is None:
        return
    cp, path = known
    if last is not None and last.seq == cp.seq and last.hash == cp.hash:
        return
    if last is None or last.seq < cp.seq or _hash_at(conn, cp.seq) != cp.hash:
        raise ChainShortened(refusal(problem(conn, cp) or "the audit trail changed under this server", path, None))


def refusal(why: str, path: Path, url: str | None) -> str:
    """The message of a writer that will not go on: both heads, and the fix."""
    verify = f"gpuledger audit verify --db {url}" if url else "gpuledger audit verify --db URL"
    return (
        f"{why} (checkpoint {path}). Nothing more is written to it: restore the missing rows (the latest "
        f"backup), then check with `{verify} --checkpoint {path}`. Only if this ledger was replaced on purpose, "
        "move the checkpoint file away (docs/AUDIT.md)"
    )
