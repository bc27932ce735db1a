"""The tables of runs whose raw intervals live in the series store only (migration 19).

``serve --series URL --series-only`` (store/series_segments.py): a run first pushed in that mode is
listed in ``series_only_runs`` (with the store it writes, as shown without a password), its GPU and
host intervals go to the store and never into ``gpu_intervals`` / ``host_intervals``, and the ledger
keeps per stream (run, GPU; the host stream under ``device_uuid = ''``) the seq ranges the store
holds for it in ``series_segments``: one row per run of consecutive seqs, with the first row's t0
and the last row's t1, which is all the timeline rules (store/series_rules.py) need of the rows
either side of a new one. A steady agent's push extends one segment per stream: a few row writes
instead of one per interval. ``series_day_sums`` holds the per run x GPU x day sums cost
queries read instead of the rows (store/series_day_sums.py).
"""

from __future__ import annotations

import sqlalchemy as sa

SERIES_ONLY_RUNS = "series_only_runs"
SERIES_SEGMENTS = "series_segments"
SERIES_DAY_SUMS = "series_day_sums"


def define(metadata: sa.MetaData) -> tuple[sa.Table, sa.Table, sa.Table]:
    runs = sa.Table(
        SERIES_ONLY_RUNS,
        metadata,
        sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("store", sa.Text, nullable=False),  # the store's URL as shown (no password)
        sa.Column("marked_at", sa.Double, nullable=False),
    )
    segments = sa.Table(
        SERIES_SEGMENTS,
        metadata,
        sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("device_uuid", sa.String, primary_key=True),  # "" for the host stream
        sa.Column("first_seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("t0", sa.Double, nullable=False),  # t0 of the row at first_seq
        sa.Column("t1", sa.Double, nullable=False),  # t1 of the row at last_seq
    )
    # per run x GPU x UTC day, what cost queries sum from raw rows (store/series_day_sums.py)
    day_sums = sa.Table(
        SERIES_DAY_SUMS,
        metadata,
        sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("device_uuid", sa.String, primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("t0", sa.Double, nullable=False),
        sa.Column("t1", sa.Double, nullable=False),
        sa.Column("busy_s", sa.Double),  # NULL: no row measured it
        sa.Column("busy_n", sa.Integer, nullable=False),
        sa.Column("energy_j", sa.Double),
        sa.Column("energy_n", sa.Integer, nullable=False),
        sa.Column("intervals", sa.Integer, nullable=False),  # rows ending in the day
    )
    return runs, segments, day_sums
