"""The columns of the capacity and fleet reports: names, units, meanings. Stable: renaming one is a
breaking change. docs/CAPACITY.md lists them in this order and a test checks the two agree.

Units as in the chargeback (core/chargeback/columns.py): ``GPU-h`` GPU-hours, ``kWh`` facility
energy, ``ratio`` 0-1, ``currency`` an exact decimal string in the rate card's currency,
``count``, ``text``, ``time`` ISO 8601 UTC.
"""

from __future__ import annotations

from gpuledger.core.chargeback.columns import Column

__all__ = ["CAPACITY_KEYS", "COLUMNS", "SHARE_RULES"]

CAPACITY_KEYS = ("host", "gpu_model", "pool", "gpu")  # what --by may name
SHARE_RULES = ("none", "allocated", "busy")

COLUMNS: dict[str, tuple[Column, ...]] = {
    # One row per group (the --by keys lead), then the TOTAL row.
    "groups": (
        Column("gpus", "count", "physical GPUs with time in the group (a GPU that moved counts on each host)"),
        Column("fleet_gpu_h", "GPU-h", "the GPUs' time in the fleet within the window: the sum of the five below"),
        Column("unallocated_gpu_h", "GPU-h", "nobody held the GPU and it was not busy"),
        Column("alloc_idle_gpu_h", "GPU-h", "held by a run, container, pod or job, not busy"),
        Column("busy_attributed_gpu_h", "GPU-h", "busy with a process whose owner was found"),
        Column("busy_unattributed_gpu_h", "GPU-h", "busy with no owner found"),
        Column("unobserved_gpu_h", "GPU-h", "in the fleet but not observed (its agent was not running)"),
        Column("unmeasured_gpu_h", "GPU-h", "observed time the driver gave no busy time for (within the above)"),
        Column("allocated_share", "ratio", "(alloc_idle + busy_attributed) / observed time"),
        Column("busy_share", "ratio", "busy (attributed + unattributed) / observed time: utilisation of capacity"),
        Column("observed_share", "ratio", "observed / fleet time"),
        Column("energy_kwh", "kWh", "the GPUs' energy x PUE, where measured"),
        Column("asset_cost", "currency", "fleet GPU-hours x the rate card's rate: what the GPUs cost, used or not"),
        Column("unallocated_cost", "currency", "unallocated GPU-hours x rate"),
        Column("alloc_idle_cost", "currency", "allocated-idle GPU-hours x rate"),
        Column("busy_attributed_cost", "currency", "busy-attributed GPU-hours x rate"),
        Column("busy_unattributed_cost", "currency", "busy-unattributed GPU-hours x rate"),
        Column("unobserved_cost", "currency", "unobserved GPU-hours x rate"),
        Column("energy_cost", "currency", "facility kWh x power price, where the rate card bills energy"),
        Column("fleet_cost", "currency", "asset_cost + energy_cost"),
        Column("unpriced_gpu_h", "GPU-h", "fleet time with no rate in the rate card (in no cost)"),
        Column("share", "ratio", "the group's fleet_cost / the report's"),
    ),
    # With --share-idle allocated|busy: one row per team, then the TOTAL row.
    "shares": (
        Column("team", "text", "the runs' team label (empty: runs without one)"),
        Column("allocated_gpu_h", "GPU-h", "the team's runs' allocated GPU-hours in the window"),
        Column("busy_gpu_h", "GPU-h", "the team's runs' busy GPU-hours in the window"),
        Column("weight", "ratio", "the team's share of the rule's hours (allocated or busy)"),
        Column("billed_cost", "currency", "what the chargeback bills the team's runs"),
        Column("shared_idle_cost", "currency", "the team's part of fleet_cost - all billed_cost, by weight"),
        Column("total_cost", "currency", "billed_cost + shared_idle_cost: the TOTAL row is the fleet's cost"),
    ),
    # gpuledger report fleet: one row per physical GPU.
    "fleet": (
        Column("gpu", "text", "the GPU's UUID (its history follows it from host to host)"),
        Column("name", "text", "the device name NVML gives"),
        Column("gpu_model", "text", "the normalisation-table key (or the name when unknown)"),
        Column("host", "text", "where it was last seen"),
        Column("hosts", "text", "every host it was seen on, oldest first, ' > '-separated"),
        Column("pool", "text", "its pool (docs/CAPACITY.md)"),
        Column("instance_type", "text", "the cloud instance type it is priced as, if any"),
        Column("price_line", "text", "the rate card line pricing it now, and how the rate was derived"),
        Column("rate", "currency", "price per GPU-hour now; empty when unpriced"),
        Column("first_seen", "time", "first sighting"),
        Column("last_seen", "time", "last sighting"),
        Column(
            "status",
            "text",
            "present, missing (its host reported later without it), silent; in use or runs only (known from runs)",
        ),
        Column("source", "text", "agent (seen by a node agent) or runs (known only from runs recorded on it)"),
    ),
}
