"""``gpuledger audit verify``: the whole ledger checked against its audit trail (docs/AUDIT.md).

1. **Signatures** (with a keyring): the head row must carry a good signature of a trusted key, made
   while that key was in use. Every writer checks the head before extending the chain and records
   unsigned rows it finds (store/audit_sign.py), so a good head vouches for every row below it.
   A bad head: the rows after the last good signature are named as written without the key.
   ``all_signatures`` checks every row's signature as well (slow: ~0.1 ms a row).
2. **The chain**: every row's hash and its link to the row before (core/audit/chain.py), read in
   one streaming pass; rows that writers found unsigned (``audit.unsigned_rows``) are named.
3. **Runs**: every sealed run is recomputed and compared with its latest seal; runs missing from
   the trail (inserted with SQL), deleted without an entry, or finished but never sealed.
4. **Tables**: users, projects, memberships, tokens, run and GPU owners, and the cost rollups
   against what the trail says (store/audit_state.py).
5. **A published head** (``expect_head``): it must still be in the chain; every seal made after it
   is listed with its reason, for a reviewer to read.
6. **The checkpoint** the server keeps outside the database (store/audit_checkpoint.py): its
   signature, and the chain must still reach it with the same hash (no truncation, no restored
   backup).

Rows the trail itself marks as forged never count as history (their seals, tokens, owners).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit import seal as seals
from gpuledger.core.audit.chain import GENESIS, check_chain
from gpuledger.core.audit.signing import Keyring
from gpuledger.core.model import run_is_open
from gpuledger.store import (
    audit_checkpoint,
    audit_seals,
    audit_sign,
    audit_state,
    capacity_audit,
    closed_months,
    liveness_sweep,
)
from gpuledger.store import schema as T

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

SEAL_ACTIONS = ("run.sealed", "run.resealed")
DELETE_ACTIONS = ("run.deleted",)
_COLUMNS = ("seq", "t", "actor", "action", "object", "payload", "prev_hash", "hash", "key_id")

ASSURANCE = {
    "none": "no audit trail: a local ledger. Nothing in it is sealed or signed; whoever can write the file "
    "can change it. Runs pushed to a team server get a signed history (docs/AUDIT.md)",
    "unsigned": "hash chain only, not signed: anyone with write access to the database could rewrite it "
    "consistently; give the writers an audit key (docs/AUDIT.md)",
    "unchecked": "signed, but the signatures were not checked: give --public-key",
    "signed": "signed",
}


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    since_head: list[str] = field(default_factory=list)  # seals made after the published head
    rows: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS
    runs_checked: int = 0
    unsealed_running: int = 0
    capacity_days_checked: int = 0  # GPU-days (one per GPU, day and host) compared with their seals
    capacity_sealed_through: str | None = None  # the last sealed capacity day (YYYY-MM-DD)
    assurance: str = "none"  # a key of ASSURANCE
    signed_through: int = 0  # the last seq vouched for by a good signature
    keys: list[str] = field(default_factory=list)  # key ids that signed rows

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(
    ledger: Ledger,
    *,
    expect_head: str | None = None,
    keyring: Keyring | None = None,
    all_signatures: bool = False,
    checkpoint: tuple[audit_checkpoint.Checkpoint, str] | None = None,
    close_after_days: float = closed_months.DEFAULT_CLOSE_AFTER_DAYS,
) -> Verification:
    """Check the ledger against its audit trail. ``keyring``: the public keys to trust (None: the
    signatures are not checked). ``expect_head``: ``seq:hash`` of a head published earlier.
    ``checkpoint``: a checkpoint the server wrote, and where it was read (for the messages).
    ``close_after_days``: when months close (the server's --close-after-days), for the runs created
    after theirs closed."""

    def tx(conn: Connection) -> Verification:
        if conn.dialect.name == "postgresql":  # one snapshot while pushes go on
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        out = _verify(conn, expect_head, keyring, all_signatures)
        out.problems += closed_months.created_late(conn, close_after_days)
        if checkpoint is not None:
            _check_checkpoint(conn, out, keyring, *checkpoint)
        return out

    return ledger.read(tx)


def _check_checkpoint(
    conn: Connection, out: Verification, keyring: Keyring | None, cp: audit_checkpoint.Checkpoint, where: str
) -> None:
    """The chain must still reach the checkpoint, with the same hash there."""
    if keyring is None:
        out.notes.append(f"checkpoint {where}: its signature was not checked (give --public-key)")
    elif not cp.trusted_by(keyring):
        out.problems.append(
            f"checkpoint {where}: not signed by a trusted key (key {cp.key_id}): changed by hand, or another ledger's"
        )
    why = audit_checkpoint.problem(conn, cp)
    if why is not None:
        out.problems.append(f"audit_log: {why} (checkpoint {where})")
    else:
        out.notes.append(f"checkpoint {where}: the chain still holds its {cp.describe()}")


def _stream(conn: Connection) -> Iterator[dict[str, Any]]:
    a = T.audit_log.c
    q = sa.select(*(a[c] for c in _COLUMNS), a.sig).order_by(a.seq)
    for row in conn.execute(q.execution_options(yield_per=5000)):
        yield dict(zip((*_COLUMNS, "sig"), row, strict=True))


def _ranges(pairs: list[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in pairs)


def _signatures(conn: Connection, out: Verification, keyring: Keyring | None) -> list[tuple[int, int]]:
    """Check the head's signature; the ranges of rows not vouched for by a trusted key."""
    head = audit_sign.head(conn)
    if head is None:
        return []
    out.head_seq, out.head_hash = head.seq, head.hash
    a = T.audit_log.c
    keys = [k for k in conn.scalars(sa.select(a.key_id).where(a.key_id.is_not(None)).distinct()) if k]
    out.keys = sorted(keys)
    if keyring is None:
        out.assurance = "unchecked" if keys else "unsigned"
        return []
    if not keys:
        out.assurance = "unsigned"
        out.problems.append(f"audit_log: not signed (no row carries a signature; trusted keys: {keyring.describe()})")
        return []
    out.assurance = "signed"
    if keyring.verify(head.seq, head.key_id, head.hash, head.sig):
        out.signed_through = head.seq
        return []
    good = audit_sign.last_trusted_seq(conn, keyring, head.seq)
    out.signed_through = good
    why = "signed by a key not trusted here" if head.key_id and head.key_id not in keyring.keys else "not signed"
    out.problems.append(
        f"audit_log seq {_ranges([(good + 1, head.seq)])}: written without the key ({why}; the last row with a good "
        f"signature is seq {good})"
    )
    return [(good + 1, head.seq)]


def _markers(conn: Connection, out: Verification) -> list[tuple[int, int]]:
    """Rows writers found unsigned (audit.unsigned_rows), and the unsigned rows before signing began."""
    a = T.audit_log.c
    q = sa.select(a.seq, a.action, a.payload).where(
        a.action.in_((audit_sign.UNSIGNED_ROWS, audit_sign.SIGNING_STARTED))
    )
    forged: list[tuple[int, int]] = []
    for seq, action, payload in conn.execute(q.order_by(a.seq)):
        try:
            body = json.loads(payload)
        except ValueError:
            continue  # an edited row: the chain check names it
        if action == audit_sign.SIGNING_STARTED:
            before = int(body.get("unsigned_before", 1)) - 1
            if before > 0:
                out.notes.append(f"audit_log seq 1-{before}: written before signing began (hash chain only)")
            continue
        first, last = int(body["first"]), int(body["last"])
        forged.append((first, last))
        out.problems.append(
            f"audit_log seq {_ranges([(first, last)])}: written without the key (found by a writer at seq {seq})"
        )
    return forged


def _all_signatures(conn: Connection, out: Verification, keyring: Keyring, excused: list[tuple[int, int]]) -> None:
    bad: list[tuple[int, int]] = []
    started = 0
    for row in _stream(conn):
        seq = int(row["seq"])
        if row["action"] == audit_sign.SIGNING_STARTED:
            started = seq
        if seq < started or any(a <= seq <= b for a, b in excused):
            continue
        if row["key_id"] is None and started == 0:
            continue  # a chain written before signing began
        if not keyring.verify(seq, row["key_id"], row["hash"], row["sig"]):
            if bad and bad[-1][1] == seq - 1:
                bad[-1] = (bad[-1][0], seq)
            else:
                bad.append((seq, seq))
    if bad:
        out.problems.append(f"audit_log seq {_ranges(bad)}: signature missing or wrong")


@dataclass
class _RunTrail:
    seals: dict[str, int] = field(default_factory=dict)  # run id -> seq of its latest seal
    created: set[str] = field(default_factory=set)
    deleted: dict[str, int] = field(default_factory=dict)


def _verify(conn: Connection, expect_head: str | None, keyring: Keyring | None, all_signatures: bool) -> Verification:
    out = Verification()
    untrusted = _signatures(conn, out, keyring) + _markers(conn, out)
    if keyring is not None and all_signatures:
        _all_signatures(conn, out, keyring, untrusted)
    head_seq, head_hash = _expected_head(expect_head)
    head_found = False
    trail = _RunTrail()
    state = audit_state.TrailState()

    def checked_rows() -> Iterator[dict[str, Any]]:
        nonlocal head_found
        for row in _stream(conn):
            out.rows += 1
            out.head_seq, out.head_hash = int(row["seq"]), str(row["hash"])
            if head_seq is not None and row["seq"] == head_seq and row["hash"] == head_hash:
                head_found = True
            yield row

    for problem in check_chain(_replayed(checked_rows(), untrusted, trail, state, out, head_seq)):
        out.problems.append(problem.message)
    if expect_head and not head_found:
        out.problems.append(f"audit_log: the recorded head {expect_head} is no longer in the chain (rows removed)")
    if out.rows and out.assurance == "none":
        out.assurance = "unsigned"
    team = out.rows > 0 or conn.execute(sa.select(T.api_tokens.c.id).limit(1)).first() is not None
    if not team:
        return out  # a local ledger: no trail to check anything against
    _check_runs(conn, trail, out)
    out.problems += audit_state.check_accounts(conn, state)
    out.problems += audit_state.check_owners(conn, state)
    out.problems += audit_state.check_rollups(conn, state)
    problems, out.capacity_days_checked = audit_state.check_capacity(conn, state)
    out.problems += problems
    if state.capacity_through is not None:
        out.capacity_sealed_through = capacity_audit.date_of(state.capacity_through)
    return out


def _expected_head(expect_head: str | None) -> tuple[int | None, str]:
    if not expect_head:
        return None, ""
    seq_text, _, want = expect_head.partition(":")
    try:
        return int(seq_text.strip()), want.strip()
    except ValueError:
        raise ValueError(f"--expect-head {expect_head!r}: give SEQ:HASH as printed by gpuledger audit head") from None


def _replayed(
    rows: Iterator[dict[str, Any]],
    untrusted: list[tuple[int, int]],
    trail: _RunTrail,
    state: audit_state.TrailState,
    out: Verification,
    head_seq: int | None,
) -> Iterator[dict[str, Any]]:
    """Pass the rows on to the chain check; replay the trusted ones into ``trail`` and ``state``."""
    for row in rows:
        yield row
        seq = int(row["seq"])
        if any(a <= seq <= b for a, b in untrusted):
            continue
        obj, action = str(row["object"]), str(row["action"])
        state.feed(seq, action, obj, row["payload"])
        if not obj.startswith("run:"):
            continue
        run_id = obj[4:]
        if action in SEAL_ACTIONS:
            trail.seals[run_id] = seq
            if head_seq is not None and seq > head_seq:
                out.since_head.append(_seal_line(row, run_id))
        elif action == "run.created":
            trail.created.add(run_id)
        elif action in DELETE_ACTIONS:
            trail.deleted[run_id] = seq


def _seal_line(row: dict[str, Any], run_id: str) -> str:
    try:
        reason = json.loads(row["payload"]).get("reason", "?")
    except ValueError:
        reason = "?"
    return f"seq {row['seq']} {row['action']} run {run_id}: {reason} (by {row['actor']})"


def _sealed_payloads(conn: Connection, seqs: list[int]) -> dict[int, dict[str, Any] | None]:
    a = T.audit_log.c
    out: dict[int, dict[str, Any] | None] = {}
    for i in range(0, len(seqs), 500):
        for seq, payload in conn.execute(sa.select(a.seq, a.payload).where(a.seq.in_(seqs[i : i + 500]))):
            try:
                out[int(seq)] = json.loads(payload)["seal"]
            except (ValueError, KeyError, TypeError):
                out[int(seq)] = None  # an edited row: the chain check names it
    return out


def _check_runs(conn: Connection, trail: _RunTrail, out: Verification) -> None:
    r = T.runs.c
    present, silenced, recording = {}, set(), set()
    for run_id, status, swept_at, ended_at in conn.execute(sa.select(r.id, r.status, r.swept_at, r.ended_at)):
        present[str(run_id)] = str(status)
        if run_is_open(status, ended_at):  # running, or discovered by a node agent that has not ended it
            recording.add(str(run_id))
        if liveness_sweep.swept(status, swept_at):  # lost by the server's verdict: its agent may still report
            silenced.add(str(run_id))
    to_check = []
    for run_id, seq in sorted(trail.seals.items()):
        if run_id not in present:
            if trail.deleted.get(run_id, 0) < seq:
                out.problems.append(f"run {run_id}: deleted (sealed at audit seq {seq}; no run.deleted entry)")
            continue
        if trail.deleted.get(run_id, 0) > seq:
            out.problems.append(f"run {run_id}: present again after its run.deleted entry")
        if run_id not in trail.created:  # sealed without ever being recorded: approved blindly
            out.problems.append(
                f"run {run_id}: sealed at audit seq {seq} but never created in the audit trail (written outside "
                "gpuledger; check it, then `gpuledger audit seal --adopt`)"
            )
        to_check.append(run_id)
    for i in range(0, len(to_check), 2000):
        chunk = to_check[i : i + 2000]
        sealed = _sealed_payloads(conn, [trail.seals[r] for r in chunk])
        for run_id, (digest, rows) in audit_seals.current_seals(conn, chunk):
            old = sealed.get(trail.seals[run_id])
            if old is None:
                continue
            out.runs_checked += 1
            out.problems += [f"run {run_id}: {diff}" for diff in seals.compare(old, digest, rows)]
    for run_id, status in sorted(present.items()):
        if run_id in trail.seals:
            continue
        if run_id not in trail.created:
            out.problems.append(f"run {run_id}: inserted outside gpuledger (no run.created entry in the audit log)")
        elif run_id in recording or run_id in silenced:
            out.unsealed_running += 1
        else:
            out.problems.append(f"run {run_id}: {status} but never sealed (see `gpuledger audit seal`)")
    for run_id in sorted(trail.created - set(present) - set(trail.deleted)):
        if run_id not in trail.seals:
            out.problems.append(f"run {run_id}: deleted (created in the audit log; no run.deleted entry)")
