"""The columns of the chargeback and cost reports: names, units, meanings. Stable: renaming one is a
breaking change. docs/CHARGEBACK.md lists them in this order and a test checks the two agree.

Units: ``GPU-h`` GPU-hours (a MIG slice counts its fraction of the GPU), ``A100-h`` A100-80GB-SXM
equivalent hours, ``kWh`` facility energy (GPU energy x PUE where the rate card gives one),
``ratio`` 0-1, ``currency`` the rate card's currency as an exact decimal string, ``count``,
``text``, ``time`` ISO 8601 UTC.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["COLUMNS", "GROUP_KEYS", "Column", "group_columns"]


@dataclass(frozen=True)
class Column:
    name: str
    unit: str  # "" when the value has no unit (text, counts are "count")
    meaning: str


GROUP_KEYS = ("team", "project", "user", "gpu_model", "instance_type", "status")

_USAGE = (
    Column("allocated_gpu_h", "GPU-h", "GPU time held (wall time x GPUs)"),
    Column("busy_gpu_h", "GPU-h", "GPU time busy: Σ busy_s / 3600 from the driver's utilisation samples"),
    Column("idle_gpu_h", "GPU-h", "allocated - busy - unmeasured"),
    Column("unmeasured_gpu_h", "GPU-h", "allocated time of GPUs that do not report utilisation"),
    Column("mean_utilization", "ratio", "busy / (allocated - unmeasured); empty when nothing was measured"),
    Column("a100eq_h", "A100-h", "busy GPU-hours x the model's normalisation factor"),
    Column("energy_kwh", "kWh", "GPU energy x PUE"),
    Column("cost", "currency", "billed hours x rate + energy cost"),
    Column("idle_cost", "currency", "idle hours x rate (in cost on the allocated basis, absorbed on the busy basis)"),
    Column("energy_cost", "currency", "facility kWh x power price (part of cost)"),
    Column("cost_per_a100eq_h", "currency", "cost / a100eq_h, 6 decimal places; empty without A100-equivalent hours"),
    Column("unpriced_gpu_h", "GPU-h", "allocated time with no rate in the rate card (not in cost)"),
)

COLUMNS: dict[str, tuple[Column, ...]] = {
    # One row per group, then a TOTAL row (the group columns read "TOTAL" / empty).
    "groups": (
        Column("runs", "count", "logical runs with use in the group (the attempts of a resumed run count once)"),
        Column("attempts", "count", "run records (attempts) with use in the group"),
        *_USAGE,
        Column("share", "ratio", "the group's cost / the report's total cost"),
        Column(
            "partial_runs", "count", "runs priced up to their last recorded interval (killed, lost, failed, running)"
        ),
        Column(
            "replayed_runs", "count", "run records metered from a replayed GPU trace (only with --include-replayed)"
        ),
    ),
    "runs": (
        Column("rank", "count", "1 = most expensive"),
        Column("run_id", "text", "the logical run: its first attempt's id"),
        Column("name", "text", "run name"),
        Column("user", "text", "who ran it"),
        Column("team", "text", "label team"),
        Column("project", "text", "label project"),
        Column("status", "text", "the last attempt's status"),
        Column("attempts", "count", "attempts (a resumed training) priced together"),
        Column("started_at", "time", "start of the first attempt"),
        Column("gpu_models", "text", "GPU models used, ';'-separated"),
        *_USAGE,
        Column(
            "flags", "text", "';'-separated: killed, lost, failed, running, replayed, shared:RULE, mig, unpriced ..."
        ),
    ),
    "users": (
        Column("rank", "count", "1 = highest"),
        Column("user", "text", "who ran it"),
        Column("runs", "count", "logical runs"),
        *_USAGE,
    ),
    "trend": (
        Column("month", "text", "YYYY-MM (UTC)"),
        Column("allocated_gpu_h", "GPU-h", "as in groups"),
        Column("busy_gpu_h", "GPU-h", "as in groups"),
        Column("idle_share", "ratio", "idle / (allocated - unmeasured)"),
        Column("a100eq_h", "A100-h", "as in groups"),
        Column("cost", "currency", "as in groups"),
        Column("cost_per_a100eq_h", "currency", "as in groups"),
    ),
    "anomalies": (
        Column("metric", "text", "cost_per_a100eq_h or idle_share"),
        Column("baseline", "number", "mean over the earlier trend months with use"),
        Column("current", "number", "the report's last month"),
        Column("change", "ratio", "(current - baseline) / baseline"),
    ),
    # gpuledger cost: one row per run and GPU, then one per run (gpu_index empty), then TOTAL.
    "cost": (
        Column("run_id", "text", "run id"),
        Column("gpu_index", "integer", "the GPU's index as the run saw it; empty on a run's total row"),
        Column("gpu_uuid", "text", "device UUID (MIG UUID for a slice)"),
        Column("gpu_model", "text", "normalisation-table key (or the device name when unknown)"),
        Column("mig_profile", "text", "MIG profile of a slice"),
        Column("instance_type", "text", "cloud instance type used for the price"),
        Column("rate", "currency", "price per GPU-hour applied (';'-separated when it changed)"),
        *_USAGE,
        Column("flags", "text", "as in runs"),
    ),
}


def group_columns(by: tuple[str, ...]) -> tuple[Column, ...]:
    """The leading columns of the groups section: one per grouping key, then ``COLUMNS["groups"]``."""
    return tuple(Column(k, "text", f"group key: {k}") for k in by)
