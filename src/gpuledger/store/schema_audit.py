"""Tables of ownership (migration 7): who may push a run, and which host a GPU belongs to.

``define(metadata)`` adds them to a MetaData that holds ``runs``. schema.py calls it for the
current shape, and migration 7 calls it on a fresh MetaData: this is the shape as version 7 created
it. When one of these tables changes, freeze a copy of this function in the migration module
first, then change it here and write the ALTER in a new migration. (Migration 7 also adds
``audit_log.key_id`` and ``audit_log.sig``: see schema.py.)
"""

from __future__ import annotations

import sqlalchemy as sa

RUN_OWNERS = "run_owners"
GPU_OWNERS = "gpu_owners"
NAMES = (RUN_OWNERS, GPU_OWNERS)


def define(metadata: sa.MetaData) -> dict[str, sa.Table]:
    # The principal a run belongs to: the user of the token that created it (an agent identity,
    # e.g. the machine's name) and the host the run record names. Only that user's tokens may push
    # it; an admin can transfer it (audited).
    run_owners = sa.Table(
        RUN_OWNERS,
        metadata,
        sa.Column("run_id", sa.String, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("user_name", sa.Text, nullable=False),
        sa.Column("token_id", sa.String(32)),  # the token that created it (or last took it over)
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("since", sa.Double, nullable=False),
    )
    # A GPU (or MIG parent) UUID belongs to the host, and the agent, that reported it first. Runs
    # of other hosts / agents that report it are refused; the shared-GPU split of the cost code
    # counts only runs of its own host. ``user_name`` NULL: any agent of that host (rows made by
    # migration 7 from the runs already stored, before agents were known).
    gpu_owners = sa.Table(
        GPU_OWNERS,
        metadata,
        sa.Column("uuid", sa.String, primary_key=True),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("user_name", sa.Text),
        sa.Column("since", sa.Double, nullable=False),
        sa.Column("source", sa.String(16), nullable=False),  # push | admin | migration
        sa.Index("ix_gpu_owners_host", "host"),
    )
    return {RUN_OWNERS: run_owners, GPU_OWNERS: gpu_owners}
