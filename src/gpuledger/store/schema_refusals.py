"""The table behind folded ``push.refused`` audit rows (migration 16; store/refusal_trail.py).

``define(metadata)`` adds it to a MetaData. schema.py calls it for the current shape and migration
16 on a fresh MetaData: this is the shape as version 16 created it. When it changes, freeze a copy
of this function in the migration module first, then change it here and write the ALTER.
"""

from __future__ import annotations

import sqlalchemy as sa

REFUSAL_FOLDS = "refusal_folds"


def define(metadata: sa.MetaData) -> sa.Table:
    # Per token: when its last push.refused row was appended, and how many refusals since then were
    # folded into the next one instead of getting a row of their own.
    return sa.Table(
        REFUSAL_FOLDS,
        metadata,
        sa.Column("token_id", sa.String(64), primary_key=True),  # "" for a writer without a token
        sa.Column("row_at", sa.Double, nullable=False),
        sa.Column("folded", sa.Integer, nullable=False),
    )
