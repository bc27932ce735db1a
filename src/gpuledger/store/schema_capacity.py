"""Tables of the capacity ledger and the fleet inventory (migration 9; docs/CAPACITY.md).

``define(metadata)`` adds them to a MetaData. schema.py calls it for the current shape, and
migration 9 calls it on a fresh MetaData: this is the shape as version 9 created it. When one of
these tables changes, freeze a copy of this function in the migration module first, then change it
here and write the ALTER in a new migration.

Times of capacity rows are integer epoch milliseconds and states integer milliseconds, so a row's
four states add up to its span exactly and sums of them stay exact (core/capacity/model.py).
"""

from __future__ import annotations

import sqlalchemy as sa

GPU_CAPACITY = "gpu_capacity"
GPU_CAPACITY_DAYS = "gpu_capacity_days"
GPU_FLEET = "gpu_fleet"
GPU_FLEET_HOSTS = "gpu_fleet_hosts"
CAPACITY_PUSHES = "capacity_pushes"
NAMES = (GPU_CAPACITY, GPU_CAPACITY_DAYS, GPU_FLEET, GPU_FLEET_HOSTS, CAPACITY_PUSHES)
STATE_COLUMNS = ("unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms")


def _states() -> list[sa.Column]:  # type: ignore[type-arg]
    return [sa.Column(name, sa.BigInteger, nullable=False) for name in (*STATE_COLUMNS, "unmeasured_ms")]


def define(metadata: sa.MetaData) -> dict[str, sa.Table]:
    # Per GPU and agent interval: how its time split into the four states. Keyed by the GPU and the
    # interval's start, so a replayed batch (an agent's retry, a push sent twice) adds nothing.
    gpu_capacity = sa.Table(
        GPU_CAPACITY,
        metadata,
        sa.Column("gpu_uuid", sa.String, primary_key=True),
        sa.Column("t0_ms", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("t1_ms", sa.BigInteger, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        *_states(),
        sa.Column("energy_j", sa.Double),  # the device's energy over the interval; NULL: not measured
        sa.Index("ix_gpu_capacity_host_t0", "host", "t0_ms"),
    )
    # The same, summed per GPU, UTC day and host (a GPU that moved that day has a row per host).
    # Kept current in the transaction that inserts the intervals: reports read only this table.
    gpu_capacity_days = sa.Table(
        GPU_CAPACITY_DAYS,
        metadata,
        sa.Column("gpu_uuid", sa.String, primary_key=True),
        sa.Column("day", sa.Integer, primary_key=True, autoincrement=False),  # days since 1970-01-01 UTC
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("first_ms", sa.BigInteger, nullable=False),
        sa.Column("last_ms", sa.BigInteger, nullable=False),
        *_states(),
        sa.Column("energy_j", sa.Double),
        sa.Column("intervals", sa.Integer, nullable=False),
        sa.Index("ix_gpu_capacity_days_day", "day"),
    )
    # The fleet: every physical GPU a node agent has seen, by UUID (its history follows it).
    gpu_fleet = sa.Table(
        GPU_FLEET,
        metadata,
        sa.Column("uuid", sa.String, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),  # the device name NVML gives
        sa.Column("host", sa.Text, nullable=False),  # where it was last seen
        sa.Column("first_seen", sa.Double, nullable=False),
        sa.Column("last_seen", sa.Double, nullable=False),
        sa.Column("instance_type", sa.Text),  # the agent's GPULEDGER_INSTANCE_TYPE, when set
        sa.Column("memory_total_b", sa.BigInteger),
        sa.Column("pci_bus_id", sa.String),
        sa.Column("mig_mode", sa.String),
    )
    # Each host a GPU was seen on, with its first and last sighting there (a GPU that moves has several).
    gpu_fleet_hosts = sa.Table(
        GPU_FLEET_HOSTS,
        metadata,
        sa.Column("uuid", sa.String, primary_key=True),
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("first_seen", sa.Double, nullable=False),
        sa.Column("last_seen", sa.Double, nullable=False),
    )
    # An agent's LOCAL ledger: per server and GPU, the first interval start not yet acknowledged.
    capacity_pushes = sa.Table(
        CAPACITY_PUSHES,
        metadata,
        sa.Column("server", sa.Text, primary_key=True),
        sa.Column("gpu_uuid", sa.String, primary_key=True),
        sa.Column("next_t0_ms", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
    return {
        GPU_CAPACITY: gpu_capacity,
        GPU_CAPACITY_DAYS: gpu_capacity_days,
        GPU_FLEET: gpu_fleet,
        GPU_FLEET_HOSTS: gpu_fleet_hosts,
        CAPACITY_PUSHES: capacity_pushes,
    }
