"""The capacity ledger in the audit trail: each UTC day's per-GPU sums are sealed once the day is
over, and a late push that adds to a sealed day reseals what it changed, so ``verify`` names a
day's figures edited, inserted or deleted with SQL (docs/AUDIT.md, "Capacity seals").

What is sealed is ``gpu_capacity_days``, what every capacity report (and the idle cost it bills)
reads; the raw intervals are covered through their sums (retention deletes them after 90 days and
keeps the sums). A seal is one audit row, ``capacity.sealed``, with a digest per GPU, day and host
of the days it covers and ``through``: every day up to it is sealed. ``capacity.resealed`` gives
the new digests of the rows a late push changed, and why.

Sealing runs in the transaction that stores capacity (``store/capacity.write_capacity``), under
the chain's lock: in a ledger with an audit trail (a team ledger) each write seals the days that
ended at least ``GRACE_DAYS`` before it and are not sealed yet, at most ``MAX_DAYS_PER_SEAL`` per
write (an upgraded ledger catches up over its next writes). A local ledger seals nothing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.pricing.usage import day_of
from gpuledger.store import rollup_audit
from gpuledger.store.schema import audit_log, gpu_capacity_days
from gpuledger.store.schema_capacity import STATE_COLUMNS

SEALED = "capacity.sealed"
RESEALED = "capacity.resealed"
OBJECT = "capacity"
ACTIONS = frozenset({SEALED, RESEALED})
# A day is sealed once the day after it is over too: an agent that was briefly away has pushed by then
# (a later push still lands: it reseals what it adds).
GRACE_DAYS = 1
MAX_DAYS_PER_SEAL = 7  # bounds one write's extra work and one audit row's size
# The columns a digest covers, in this order (the key, gpu_uuid, day and host, is the payload's nesting).
COLUMNS = ("first_ms", "last_ms", *STATE_COLUMNS, "unmeasured_ms", "energy_j", "intervals")

Key = tuple[str, int, str]  # (gpu_uuid, day, host)
Digests = dict[Key, str]


def row_digest(row: Mapping[str, Any]) -> str:
    """One ``gpu_capacity_days`` row's figures, as the same text from either database."""
    values = []
    for col in COLUMNS:
        v = row[col]
        if v is not None:
            if col == "energy_j":
                v = float(v)
                v = None if math.isnan(v) else v
            else:
                v = int(v)
        values.append(v)
    return hashlib.sha256(repr(tuple(values)).encode("utf-8")).hexdigest()[:32]


def nest(digests: Digests) -> dict[str, dict[str, dict[str, str]]]:
    """{day: {gpu_uuid: {host: digest}}}: the payload's form (JSON keys are text)."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for (uuid, day, host), d in sorted(digests.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        out.setdefault(str(day), {}).setdefault(uuid, {})[host] = d
    return out


def unnest(days: Any) -> Digests:
    """The inverse of ``nest``; what is not in that form is skipped (verify names edited rows anyway)."""
    out: Digests = {}
    if not isinstance(days, dict):
        return out
    for day, gpus in days.items():
        if not (isinstance(gpus, dict) and str(day).lstrip("-").isdigit()):
            continue
        for uuid, hosts in gpus.items():
            if isinstance(hosts, dict):
                for host, d in hosts.items():
                    out[(str(uuid), int(day), str(host))] = str(d)
    return out


_D = gpu_capacity_days.c
_ROWS = sa.select(_D.gpu_uuid, _D.day, _D.host, *(_D[c] for c in COLUMNS))  # what a digest reads, with the key


def digests(conn: Connection, *, upto_day: int | None = None, from_day: int | None = None) -> Digests:
    """The digest of every ``gpu_capacity_days`` row in the day range (both ends included)."""
    d = _D
    q = _ROWS
    if from_day is not None:
        q = q.where(d.day >= from_day)
    if upto_day is not None:
        q = q.where(d.day <= upto_day)
    return {(r["gpu_uuid"], int(r["day"]), r["host"]): row_digest(r) for r in conn.execute(q).mappings()}


def _digests_of(conn: Connection, keys: Iterable[Key]) -> Digests:
    by_day: dict[int, set[Key]] = {}
    for k in keys:
        by_day.setdefault(k[1], set()).add(k)
    out: Digests = {}
    for day, wanted in by_day.items():
        out.update({k: v for k, v in digests(conn, from_day=day, upto_day=day).items() if k in wanted})
    return out


# The latest seal row, by the object's index (built once: this runs in every capacity write).
_LATEST_SEAL = (
    sa.select(audit_log.c.payload)
    .where(audit_log.c.object == OBJECT, audit_log.c.action == SEALED)
    .order_by(audit_log.c.seq.desc())
    .limit(1)
)


def sealed_through(conn: Connection) -> int | None:
    """The last day the trail's capacity seals cover (every day up to it is sealed); None: none yet."""
    payload = conn.scalar(_LATEST_SEAL)
    if payload is None:
        return None
    try:
        through = json.loads(payload).get("through")
    except (ValueError, AttributeError):
        return None  # an edited row: verify names it
    return through if isinstance(through, int) else None


def unsealed_in(conn: Connection, first_day: int, last_day: int) -> tuple[int | None, int | None]:
    """(the last sealed day or None, the first day of [first_day, last_day] with rows after it or
    None); (None, None) for a ledger without an audit trail (nothing is ever sealed there)."""
    if not rollup_audit.audited(conn):
        return None, None
    through = sealed_through(conn)
    d = gpu_capacity_days.c
    after = first_day if through is None else max(first_day, through + 1)
    day = conn.scalar(sa.select(sa.func.min(d.day)).where(d.day >= after, d.day <= last_day))
    return through, None if day is None else int(day)


def after_write(conn: Connection, changed: Iterable[Key], added: int, now: float | None = None) -> None:
    """In the transaction of a capacity write that changed the day rows ``changed`` (``added`` new
    intervals): reseal the sealed ones, then seal the days now due."""
    from gpuledger.store import audit  # audit -> audit_verify -> audit_state imports this module

    changed = list(changed)
    through = sealed_through(conn)
    if through is None and not rollup_audit.audited(conn):
        return  # a local ledger keeps no trail
    last_due = day_of(time.time() if now is None else now) - 1 - GRACE_DAYS
    # The usual write (today's rows, nothing due) needs no lock. Rows of a day that another writer,
    # whose clock is already past midnight, may be sealing right now do.
    if all(k[1] > last_due + 1 for k in changed):
        if through is not None and through >= last_due:
            return
        if through is None:
            first = _first_day(conn)
            if first is None or first > last_due:
                return  # a new fleet (or none yet): no day of it is over
    audit.lock(conn)  # then read what is sealed again: a sealer that held the lock has committed
    through = sealed_through(conn)
    late = [k for k in changed if through is not None and k[1] <= through]
    if late:
        payload = {"why": f"late push: {added} capacity intervals added", "days": nest(_digests_of(conn, late))}
        audit.append(conn, actor="gpuledger capacity", action=RESEALED, obj=OBJECT, payload=payload)
    _seal_due(conn, through, last_due)


def _first_day(conn: Connection) -> int | None:
    """The earliest day the table holds (None: empty)."""
    first = conn.scalar(sa.select(sa.func.min(gpu_capacity_days.c.day)))
    return None if first is None else int(first)


def _seal_due(conn: Connection, through: int | None, last_due: int) -> None:
    from gpuledger.store import audit

    first = _first_day(conn) if through is None else through + 1
    if first is None or first > last_due:
        return  # nothing stored yet, or nothing due
    upto = min(last_due, first + MAX_DAYS_PER_SEAL - 1)
    payload = {"from": first, "through": upto, "days": nest(digests(conn, from_day=first, upto_day=upto))}
    audit.append(conn, actor="gpuledger capacity", action=SEALED, obj=OBJECT, payload=payload)


def days_covered(action: str, payload: Mapping[str, Any]) -> list[int]:
    """The days an audit row of ``action`` speaks for: a seal, every day of its range (also those
    that had no rows: rows that appear there later are not in the seal); a reseal, the days it names."""
    first, through = payload.get("from"), payload.get("through")
    if action == SEALED and isinstance(first, int) and isinstance(through, int):
        return list(range(first, through + 1))
    days = payload.get("days")
    return [int(d) for d in days if str(d).lstrip("-").isdigit()] if isinstance(days, dict) else []


def check(conn: Connection, day_seqs: Mapping[int, Sequence[int]], through: int | None) -> tuple[list[str], int]:
    """Every sealed day's rows against their latest seal (``day_seqs``: the seals covering each
    day, replayed from the trail), a day at a time: (problems, rows checked)."""
    if through is None:
        return [], 0
    out: list[str] = []
    checked = 0
    payloads = _Payloads(conn)
    for day, now in _days_and_rows(conn, sorted(d for d in day_seqs if d <= through), through):
        sealed: Digests = {}
        seqs: dict[Key, int] = {}
        for seq in day_seqs.get(day, ()):  # in trail order: the latest seal of a row wins
            for key, d in unnest({str(day): payloads.day(seq, day)}).items():
                sealed[key], seqs[key] = d, seq
        checked += len(now)
        for key in sorted(set(now) | set(sealed)):
            uuid, _, host = key
            where = f"gpu_capacity_days: GPU {uuid} on {date_of(day)} (host {host!r})"
            if key not in sealed:
                out.append(f"{where}: not in the capacity seal of that day (inserted outside gpuledger)")
            elif key not in now:
                out.append(f"{where}: sealed at audit seq {seqs[key]}, deleted outside gpuledger")
            elif now[key] != sealed[key]:
                out.append(f"{where}: edited (differs from its seal at audit seq {seqs[key]})")
    return out, checked


def _days_and_rows(conn: Connection, trail_days: list[int], through: int) -> Iterator[tuple[int, Digests]]:
    """(day, digests of its rows now) for every day up to ``through`` that the trail covers or the
    table holds, in day order, streaming the table."""
    q = _ROWS.where(_D.day <= through).order_by(_D.day)
    rows = conn.execute(q.execution_options(yield_per=10_000)).mappings()
    by_day = ((day, {(r["gpu_uuid"], day, r["host"]): row_digest(r) for r in group})
              for day, group in itertools.groupby(rows, key=lambda r: int(r["day"])))  # fmt: skip
    pending = iter(trail_days)
    nxt = next(pending, None)
    for day, now in by_day:
        while nxt is not None and nxt < day:
            yield nxt, {}  # sealed, and no row left
            nxt = next(pending, None)
        if nxt == day:
            nxt = next(pending, None)
        yield day, now
    while nxt is not None:
        yield nxt, {}
        nxt = next(pending, None)


class _Payloads:
    """Seal payloads read back by seq, the last few kept (a seal covers up to a week of days)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._kept: dict[int, dict[str, Any]] = {}

    def day(self, seq: int, day: int) -> Any:
        days = self._kept.get(seq)
        if days is None:
            text = self._conn.scalar(sa.select(audit_log.c.payload).where(audit_log.c.seq == seq))
            try:
                days = json.loads(text or "{}").get("days") or {}
            except (ValueError, AttributeError):
                days = {}  # an edited row: the chain check names it
            if len(self._kept) >= 2 * MAX_DAYS_PER_SEAL:
                self._kept.pop(next(iter(self._kept)))
            self._kept[seq] = days
        return days.get(str(day), {}) if isinstance(days, dict) else {}


def date_of(day: int) -> str:
    """A UTC day number as YYYY-MM-DD."""
    return time.strftime("%Y-%m-%d", time.gmtime(day * 86_400))
