"""Tables of partial acceptance and liveness (migration 8): what a server refused, what an agent
was told, and when each run was last pushed.

``define(metadata)`` adds them to a MetaData that holds ``runs``. schema.py calls it for the
current shape, and migration 8 calls it on a fresh MetaData: this is the shape as version 8 created
it. When one of these tables changes, freeze a copy of this function in the migration module
first, then change it here and write the ALTER in a new migration.
"""

from __future__ import annotations

import sqlalchemy as sa

QUARANTINED_ROWS = "quarantined_rows"
RUN_LIVENESS = "run_liveness"
PUSH_QUARANTINE = "push_quarantine"
NAMES = (QUARANTINED_ROWS, RUN_LIVENESS, PUSH_QUARANTINE)

# SQLite only auto-numbers an INTEGER PRIMARY KEY.
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def define(metadata: sa.MetaData) -> dict[str, sa.Table]:
    # Server side: rows of a push that failed validation, kept with why and who sent them, so
    # the rest of the batch could be stored. One row per distinct item: a resent batch adds nothing.
    quarantined_rows = sa.Table(
        QUARANTINED_ROWS,
        metadata,
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("series", sa.String(16), nullable=False),  # gpu_rows, host_intervals, events ...
        sa.Column("item", sa.Text, nullable=False),  # what the row said it was: "GPU-0 seq 7", "seq 3"
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),  # "user (token id)"
        sa.Column("token_id", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),  # the item as sent (JSON), cut at 64 KiB
        sa.Column("payload_sha256", sa.String(64), nullable=False),  # of the whole item
        sa.Column("received_at", sa.Double, nullable=False),
        sa.UniqueConstraint("run_id", "series", "payload_sha256", name="uq_quarantined_rows_item"),
    )
    # Server side: when the run's agent last pushed anything (the liveness sweep reads it).
    run_liveness = sa.Table(
        RUN_LIVENESS,
        metadata,
        sa.Column("run_id", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("last_push_at", sa.Double, nullable=False),
    )
    # Agent side (the local ledger): rows a server quarantined, as its answer said.
    push_quarantine = sa.Table(
        PUSH_QUARANTINE,
        metadata,
        sa.Column("server", sa.Text, primary_key=True),
        sa.Column("run_id", sa.String, primary_key=True),
        sa.Column("series", sa.String(16), primary_key=True),
        sa.Column("item", sa.Text, primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("at", sa.Double, nullable=False),
    )
    return {QUARANTINED_ROWS: quarantined_rows, RUN_LIVENESS: run_liveness, PUSH_QUARANTINE: push_quarantine}
