"""The team-server tables: accounts and tokens, the audit chain, the agent outbox, rollup marks.

``define(metadata)`` adds them to a MetaData. schema.py calls it for the current shape, and the
migration that introduced them (migrations.py, version 3) calls it on a fresh MetaData: this is the
shape as version 3 created it. When one of these tables changes, freeze a copy of this function in
the migration module first, then change it here and write the ALTER in a new migration.
"""

from __future__ import annotations

import sqlalchemy as sa

USERS = "users"
PROJECTS = "projects"
MEMBERSHIPS = "memberships"
API_TOKENS = "api_tokens"
AUDIT_LOG = "audit_log"
PUSH_STATE = "push_state"
ROLLUP_MARKS = "rollup_marks"
NAMES = (USERS, PROJECTS, MEMBERSHIPS, API_TOKENS, AUDIT_LOG, PUSH_STATE, ROLLUP_MARKS)


def define(metadata: sa.MetaData, json_type: sa.types.TypeEngine[object]) -> dict[str, sa.Table]:
    """The team tables in ``metadata`` (which must hold ``runs`` for the rollup marks' key)."""
    users = sa.Table(
        USERS,
        metadata,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("disabled", sa.Boolean, nullable=False, default=False),
    )
    projects = sa.Table(
        PROJECTS,
        metadata,
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("created_at", sa.Double, nullable=False),
    )
    memberships = sa.Table(
        MEMBERSHIPS,
        metadata,
        sa.Column("user_name", sa.Text, sa.ForeignKey("users.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("project", sa.Text, sa.ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True),
        sa.Index("ix_memberships_project", "project"),
    )
    # A token is shown once; only the sha256 of its secret part is kept. ``projects`` (JSON list)
    # narrows what the token may reach; NULL means "the user's memberships" (admin: everything).
    api_tokens = sa.Table(
        API_TOKENS,
        metadata,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_name", sa.Text, sa.ForeignKey("users.name", ondelete="CASCADE"), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("projects", json_type),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("note", sa.Text),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("expires_at", sa.Double),
        sa.Column("revoked_at", sa.Double),
        # migration 15: the host an agent token is bound to (its machine: only it reports that
        # host's GPUs and capacity); NULL for admin, member and older agent tokens
        sa.Column("host", sa.Text),
        sa.Index("ix_api_tokens_user", "user_name"),
    )
    # Hash-chained: hash = sha256(canonical JSON of the row's fields + prev_hash). ``payload`` is the
    # canonical JSON text itself, so what was hashed is exactly what is stored.
    audit_log = sa.Table(
        AUDIT_LOG,
        metadata,
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("t", sa.Double, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("object", sa.Text, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Index("ix_audit_log_object", "object"),
    )
    # The agent's outbox, kept in the LOCAL ledger: per server and run, what was acknowledged.
    # Watermarks are "next seq to push": gpu_next is {device uuid: seq}.
    push_state = sa.Table(
        PUSH_STATE,
        metadata,
        sa.Column("server", sa.Text, primary_key=True),
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("gpu_next", json_type, nullable=False),
        sa.Column("host_next", sa.Integer, nullable=False, default=0),
        sa.Column("event_next", sa.Integer, nullable=False, default=0),
        sa.Column("metric_next", sa.Integer, nullable=False, default=0),
        sa.Column("run_sig", sa.String(64)),  # sha256 of the run record + devices last acknowledged
        sa.Column("log_sig", sa.String(64)),  # sha256 of the log last acknowledged
        sa.Column("done", sa.Boolean, nullable=False, default=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("last_error", sa.Text),
        sa.Index("ix_push_state_done", "done"),
    )
    # Retention: per run and series (gpu device uuid, or "" for the host series), the raw intervals
    # up to ``upto_seq`` were replaced by intervals of ``level_s`` seconds. A late replay of those
    # raw intervals is dropped instead of being stored beside their rollup.
    rollup_marks = sa.Table(
        ROLLUP_MARKS,
        metadata,
        sa.Column("run_id", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("series", sa.String(8), primary_key=True),
        sa.Column("device_uuid", sa.String, primary_key=True),
        sa.Column("level_s", sa.Integer, nullable=False),
        sa.Column("upto_seq", sa.Integer, nullable=False),
        sa.Column("rows_before", sa.Integer, nullable=False),
        sa.Column("rows_after", sa.Integer, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )
    return {
        USERS: users,
        PROJECTS: projects,
        MEMBERSHIPS: memberships,
        API_TOKENS: api_tokens,
        AUDIT_LOG: audit_log,
        PUSH_STATE: push_state,
        ROLLUP_MARKS: rollup_marks,
    }
