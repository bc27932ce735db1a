"""Per stream of a series-only run, what ``/metrics`` reads of its rows (migration 20).

A series-only run's rows live in the series store only (store/series_segments.py); the ledger
keeps their GPU x day busy and energy sums (``series_day_sums``). ``series_streams`` holds, per
stream (run, GPU; the host stream under ``device_uuid = ''``), the rest of what ``/metrics``
shows of a plain run's rows: the host's CPU time and each GPU's throttle time per reason, summed
in integer µs as ``/metrics`` sums a plain run's rows (so both read the same), and the gauges of
the stream's row with the highest seq (store/series_streams.py).

``complete`` is false for a stream some of whose rows the store held before this table existed
(a run created under version 19): its sums miss those rows, so they read n/a until
``gpuledger db migrate --series URL`` recomputes them from the store.
"""

from __future__ import annotations

import sqlalchemy as sa

SERIES_STREAMS = "series_streams"
# The throttle reasons with a column, as migration 20 wrote them (prom/names.THROTTLE_REASONS then):
# a reason added there later needs a migration adding its column.
REASONS = ("power", "thermal", "sync_boost", "board_limit", "low_util", "reliability", "hw_slowdown", "hw_power_brake")
GAUGES = ("power_max_w", "mem_used_last_b", "temp_max_c")  # of the row at last_seq, as /metrics shows


def throttle_column(reason: str) -> str:
    return f"throttle_{reason}_us"


def define(metadata: sa.MetaData) -> sa.Table:
    return sa.Table(
        SERIES_STREAMS,
        metadata,
        sa.Column("run_id", sa.String(36), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("device_uuid", sa.String, primary_key=True),  # "" for the host stream
        sa.Column("complete", sa.Boolean, nullable=False),  # the sums count every row the store holds
        sa.Column("last_seq", sa.BigInteger, nullable=False),  # the gauges' row (-1: none yet)
        sa.Column("power_max_w", sa.Double),
        sa.Column("mem_used_last_b", sa.BigInteger),
        sa.Column("temp_max_c", sa.Double),
        sa.Column("cpu_us", sa.BigInteger),  # host stream; NULL: no row measured it
        *(sa.Column(throttle_column(r), sa.BigInteger) for r in REASONS),  # GPU streams; NULL likewise
    )
