"""The run_lineage table (migration 17): what a run says about its model's line, kept for lookup.

One row per training run that recorded ``meta.lineage`` and per evaluation run that recorded the
weights it evaluated (``meta.evaluation.weights.sha256``). It exists so that finding a training's
parent (the run whose best.pt is the training's ``model=``) or a version's evaluations is an indexed
lookup, never a scan of every run's meta. store/lineage.py keeps it in step with ``runs.meta``.
"""

from __future__ import annotations

import sqlalchemy as sa

RUN_LINEAGE = "run_lineage"


def define(metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        RUN_LINEAGE,
        metadata,
        sa.Column("run_id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),  # "training" or "evaluation"
        sa.Column("model_line", sa.Text),
        sa.Column("model_version", sa.Text),
        sa.Column("weights_sha256", sa.String(64)),  # training: best.pt produced; evaluation: weights evaluated
        sa.Column("source_sha256", sa.String(64)),  # training: the model= weights it started from
        sa.Column("parent_run", sa.String(36)),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Index("ix_run_lineage_weights", "weights_sha256"),
        sa.Index("ix_run_lineage_version", "model_version"),
        sa.Index("ix_run_lineage_parent", "parent_run"),
    )
