"""What the audit trail says the access and ownership tables hold, and where they differ now.

``TrailState.feed`` replays the trail's rows (in seq order) into the state they describe: users,
projects, memberships, tokens (role, projects, expiry, revocation, secret), run owners, GPU owners
and the digests of the cost rollups. ``check_tables`` compares that with the tables and names each
difference, so an ``UPDATE api_tokens SET role = 'admin'``, an un-revoked token, a membership or a
rollup inserted with SQL are all found. Rows written before a field was audited (older payloads)
are compared on what they say.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import capacity_audit, capacity_fleet, quarantine_audit, rollup_audit, schema

ACCOUNT_ACTIONS = frozenset({"user.added", "project.added", "member.added", "member.removed", "token.issued",
                             "token.revoked"})  # fmt: skip
OWNER_ACTIONS = frozenset({"run.created", "run.transferred", "run.owner_claimed", "run.deleted"})
GPU_ACTIONS = frozenset({"gpu.registered", "gpu.claimed", "gpu.rehomed"})
ROLLUP_ACTIONS = frozenset({rollup_audit.WRITTEN, rollup_audit.DROPPED, "run.deleted"})
TABLE_ACTIONS = capacity_audit.ACTIONS | capacity_fleet.ACTIONS | {quarantine_audit.ACTION}
REPLAYED = ACCOUNT_ACTIONS | OWNER_ACTIONS | GPU_ACTIONS | ROLLUP_ACTIONS | TABLE_ACTIONS


def secret_check(secret_sha256: str) -> str:
    """What the trail keeps of a token's secret: a hash of the stored hash (never the secret)."""
    return hashlib.sha256(f"gpuledger-token:{secret_sha256}".encode()).hexdigest()[:32]


@dataclass
class TrailState:
    users: dict[str, int] = field(default_factory=dict)  # name -> seq added
    projects: dict[str, int] = field(default_factory=dict)
    members: dict[tuple[str, str], int] = field(default_factory=dict)  # (user, project) -> seq
    tokens: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> fields the trail states, + seq
    owners: dict[str, tuple[str, int]] = field(default_factory=dict)  # run id -> (user, seq)
    gpus: dict[str, tuple[str, str | None, int]] = field(default_factory=dict)  # uuid -> (host, user, seq)
    rollups: dict[str, tuple[str | None, int]] = field(default_factory=dict)  # run id -> (digest | None, seq)
    rollups_audited: bool = False
    # day -> the seqs of the capacity seals covering it, in order (their digests are read back one
    # day at a time by the check: a year of a large fleet's digests is not held at once)
    capacity_days: dict[int, list[int]] = field(default_factory=dict)
    capacity_through: int | None = None  # every day up to this one is sealed
    fleet: capacity_fleet.FleetTrail = field(default_factory=capacity_fleet.FleetTrail)  # gpu_fleet(_hosts)
    quarantine: quarantine_audit.QuarantineTrail = field(default_factory=quarantine_audit.QuarantineTrail)

    def feed(self, seq: int, action: str, obj: str, payload_text: str) -> None:
        if action not in REPLAYED:
            return
        try:
            payload = json.loads(payload_text)
        except ValueError:
            return  # an edited row: the chain check names it
        kind, _, name = obj.partition(":")
        if action == "user.added":
            self.users[name] = seq
        elif action == "project.added":
            self.projects[name] = seq
        elif action == "member.added":
            self.members[(str(payload.get("user")), name)] = seq
        elif action == "member.removed":
            self.members.pop((str(payload.get("user")), name), None)
        elif action == "token.issued":
            self.tokens[name] = {**payload, "seq": seq, "revoked": None}
        elif action == "token.revoked" and name in self.tokens:
            self.tokens[name]["revoked"] = (payload.get("revoked_at", True), seq)
        elif action in ("run.created", "run.owner_claimed") and payload.get("owner"):
            self.owners[name] = (str(payload["owner"]), seq)
        elif action == "run.transferred":
            self.owners[name] = (str(payload.get("to")), seq)
        elif action in GPU_ACTIONS:
            self.gpus[name] = (str(payload.get("host")), payload.get("user"), seq)
        elif action == rollup_audit.WRITTEN:
            self.rollups_audited = True
            for run_id, d in (payload.get("runs") or {}).items():
                self.rollups[run_id] = (d, seq)
        elif action == rollup_audit.DROPPED:
            for run_id in payload.get("runs") or ():
                self.rollups[run_id] = (None, seq)
        elif action == quarantine_audit.ACTION and kind == "run":
            self.quarantine.feed(seq, name, payload)
        elif action in capacity_fleet.ACTIONS:
            self.fleet.feed(seq, payload)
        elif action in capacity_audit.ACTIONS:
            for day in capacity_audit.days_covered(action, payload):
                self.capacity_days.setdefault(day, []).append(seq)
            through = payload.get("through")
            if action == capacity_audit.SEALED and isinstance(through, int):
                self.capacity_through = max(through, self.capacity_through or through)
        if action == "run.deleted" and kind == "run":
            self.quarantine.deleted(name)  # its quarantine goes with it (a foreign key)
            self.owners.pop(name, None)
            self.rollups.pop(name, None)


def _rows(conn: Connection, table: sa.Table) -> list[Mapping[str, Any]]:
    return list(conn.execute(sa.select(table)).mappings())


def check_accounts(conn: Connection, state: TrailState) -> list[str]:
    out: list[str] = []
    users = {r["name"]: r for r in _rows(conn, schema.users)}
    for name in sorted(set(users) - set(state.users)):
        out.append(f"users {name!r}: not in the audit trail (inserted outside gpuledger)")
    for name in sorted(set(state.users) - set(users)):
        out.append(f"users {name!r}: added at audit seq {state.users[name]}, deleted outside gpuledger")
    for name in sorted(set(users) & set(state.users)):
        if users[name]["disabled"]:
            out.append(f"users {name!r}: disabled outside gpuledger (no audit entry)")
    projects = {r["name"] for r in _rows(conn, schema.projects)}
    for name in sorted(projects - set(state.projects)):
        out.append(f"projects {name!r}: not in the audit trail (inserted outside gpuledger)")
    for name in sorted(set(state.projects) - projects):
        out.append(f"projects {name!r}: added at audit seq {state.projects[name]}, deleted outside gpuledger")
    members = {(r["user_name"], r["project"]) for r in _rows(conn, schema.memberships)}
    for user, project in sorted(members - set(state.members)):
        out.append(f"memberships: {user!r} in {project!r} is not in the audit trail (inserted outside gpuledger)")
    for user, project in sorted(set(state.members) - members):
        seq = state.members[(user, project)]
        out.append(f"memberships: {user!r} in {project!r} (added at audit seq {seq}) deleted outside gpuledger")
    out += _check_tokens(conn, state)
    return out


def _same_number(a: Any, b: Any) -> bool:
    return a == b or (a is not None and b is not None and abs(float(a) - float(b)) < 1e-6)


def _check_tokens(conn: Connection, state: TrailState) -> list[str]:
    out: list[str] = []
    tokens = {r["id"]: r for r in _rows(conn, schema.api_tokens)}
    for token_id in sorted(set(tokens) - set(state.tokens)):
        out.append(f"api_tokens {token_id}: not in the audit trail (inserted outside gpuledger)")
    for token_id in sorted(set(state.tokens) - set(tokens)):
        seq = state.tokens[token_id]["seq"]
        out.append(f"api_tokens {token_id}: issued at audit seq {seq}, deleted outside gpuledger")
    for token_id in sorted(set(tokens) & set(state.tokens)):
        row, said = tokens[token_id], state.tokens[token_id]
        where = f"api_tokens {token_id}"
        at = f"(issued at audit seq {said['seq']})"
        if "user" in said and row["user_name"] != said["user"]:
            out.append(f"{where}: user is {row['user_name']!r}, the audit trail says {said['user']!r} {at}")
        if "role" in said and row["role"] != said["role"]:
            out.append(f"{where}: role is {row['role']!r}, the audit trail says {said['role']!r} {at}")
        if "projects" in said and (row["projects"] or None) != (said["projects"] or None):
            out.append(f"{where}: projects are {row['projects']!r}, the audit trail says {said['projects']!r} {at}")
        if "expires_at" in said and not _same_number(row["expires_at"], said["expires_at"]):
            out.append(f"{where}: expires at {row['expires_at']}, the audit trail says {said['expires_at']} {at}")
        if (row["host"] or None) != (said.get("host") or None):  # a token issued before hosts is bound to none
            out.append(f"{where}: bound to host {row['host']!r}, the audit trail says {said.get('host')!r} {at}")
        if "secret" in said and secret_check(row["secret_sha256"]) != said["secret"]:
            out.append(f"{where}: its secret was replaced outside gpuledger {at}")
        revoked = said["revoked"]
        if revoked is not None and row["revoked_at"] is None:
            out.append(f"{where}: revoked at audit seq {revoked[1]} but not revoked now (un-revoked outside gpuledger)")
        elif revoked is None and row["revoked_at"] is not None:
            out.append(f"{where}: revoked outside gpuledger (no token.revoked entry)")
        elif revoked is not None and revoked[0] is not True and not _same_number(row["revoked_at"], revoked[0]):
            out.append(f"{where}: revoked_at is {row['revoked_at']}, the audit trail says {revoked[0]}")
    return out


def check_owners(conn: Connection, state: TrailState) -> list[str]:
    out: list[str] = []
    owners = {r["run_id"]: r for r in _rows(conn, schema.run_owners)}
    for run_id in sorted(set(owners) | set(state.owners)):
        row, said = owners.get(run_id), state.owners.get(run_id)
        if said is None:
            out.append(f"run {run_id}: owner {row['user_name']!r} is not in the audit trail (set outside gpuledger)")  # type: ignore[index]
        elif row is None:
            out.append(f"run {run_id}: its owner {said[0]!r} (audit seq {said[1]}) was removed outside gpuledger")
        elif row["user_name"] != said[0]:
            out.append(f"run {run_id}: owner is {row['user_name']!r}, the audit trail says {said[0]!r} (seq {said[1]})")
    gpus = {r["uuid"]: r for r in _rows(conn, schema.gpu_owners)}
    for uuid in sorted(set(gpus) | set(state.gpus)):
        row, said = gpus.get(uuid), state.gpus.get(uuid)
        if said is None:
            if row is not None and row["source"] == "migration" and _host_used(conn, uuid, row["host"]):
                continue  # known from the runs stored before GPUs had owners (migration 7)
            out.append(f"gpu {uuid}: owner host {row['host']!r} is not in the audit trail (set outside gpuledger)")  # type: ignore[index]
        elif row is None:
            out.append(f"gpu {uuid}: registered to {said[0]!r} at audit seq {said[2]}, removed outside gpuledger")
        elif (row["host"], row["user_name"]) != (said[0], said[1]):
            out.append(
                f"gpu {uuid}: belongs to {row['host']!r} ({row['user_name']}), the audit trail says {said[0]!r} "
                f"({said[1]}) (seq {said[2]})"
            )
    return out + capacity_fleet.check(conn, state.fleet) + quarantine_audit.check(conn, state.quarantine)


def _host_used(conn: Connection, uuid: str, host: str) -> bool:
    d, r = schema.devices.c, schema.runs.c
    q = (
        sa.select(r.id)
        .select_from(schema.devices.join(schema.runs, r.id == d.run_id))
        .where(sa.or_(d.uuid == uuid, d.mig_parent_uuid == uuid), r.host == host)
        .limit(1)
    )
    return conn.execute(q).first() is not None


def check_rollups(conn: Connection, state: TrailState) -> list[str]:
    """Each run's rollup rows against the digest the trail holds for it, and its rolled_up flag."""
    out: list[str] = []
    digests, flags = rollup_audit.stored_digests(conn)
    hint = "set outside gpuledger, or rolled up before rollups were audited: see `gpuledger audit seal`"
    for run_id in sorted(set(digests) | {r for r, f in flags.items() if f}):
        flagged, now, said = flags.get(run_id), digests.get(run_id), state.rollups.get(run_id)
        if flagged is None:
            continue  # rows of a run deleted since: the foreign key removes them
        if not flagged:  # gpuledger writes and drops rows and flag together
            out.append(f"run {run_id}: gpu_rollups present but runs.rolled_up is false (changed outside gpuledger)")
        elif said is None:
            out.append(f"run {run_id}: rolled up, but the audit trail holds no rollups for it ({hint})")
        elif said[0] is None:
            out.append(f"run {run_id}: rolled up, though its rollups were dropped at audit seq {said[1]} (by SQL)")
        elif (now or rollup_audit.digest(())) != said[0]:
            out.append(f"run {run_id}: gpu_rollups edited (they differ from what was written at audit seq {said[1]})")
    return out


def check_capacity(conn: Connection, state: TrailState) -> tuple[list[str], int]:
    """Each sealed day's per-GPU capacity sums against their latest seal: (problems, GPU-days checked)."""
    return capacity_audit.check(conn, state.capacity_days, state.capacity_through)
