"""The wire format of ``POST /api/v1/ingest``: pydantic models whose field names are the ledger's
column names (core/model.py), with limits that turn absurd values into a clear 422.

Checked by pydantic (per field): types, non-negative integrals and byte counts, finite floats (NaN
and Infinity are refused as JSON tokens; a training metric may say ``"NaN"`` as a string because a
NaN loss is a result), string lengths, unknown fields. Intervals come as objects (TypedDicts,
readable) or as compact rows (rows.py, what agents send). batch_check.py validates a push row by
row (partial acceptance) and adds what spans fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Required, TypedDict

from gpuledger.server.rows import GPU_COLUMNS, HOST_COLUMNS, GpuRow, HostRow
from gpuledger.server.wire_types import (
    FUTURE_SKEW_S,
    MAX_INTERVAL_S,
    MAX_WATTS,
    Bytes,
    Celsius,
    Count,
    NonNeg,
    Pct,
    RunId,
    Seq,
    Short,
    Status,
    T,
    Text,
    Watts,
)

__all__ = ["FUTURE_SKEW_S", "GPU_COLUMNS", "HOST_COLUMNS", "MAX_INTERVAL_S", "MAX_WATTS", "IngestBatch", "IngestResult"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GpuIntervalIn(TypedDict, total=False):
    """One GPU interval (core/model.py GpuInterval). Validated as a plain dict: the hot path."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    device_uuid: Required[Short]
    seq: Required[Seq]
    t0: Required[T]
    t1: Required[T]
    samples: Count
    busy_s: NonNeg | None
    util_method: Short | None
    util_max_pct: Pct | None
    util_idle_s: NonNeg | None
    util_unknown_s: NonNeg | None
    util_unmeasured_s: NonNeg | None
    energy_j: NonNeg | None
    energy_method: Short | None
    power_max_w: Watts | None
    mem_used_max_b: Bytes | None
    mem_used_last_b: Bytes | None
    mem_reserved_b: Bytes | None
    proc_mem_max_b: Bytes | None
    proc_sm_util_avg_pct: Pct | None
    proc_method: Short | None
    temp_max_c: Celsius | None
    sm_clock_avg_mhz: NonNeg | None
    mem_clock_max_mhz: NonNeg | None
    throttle_s: dict[Short, NonNeg] | None


class HostIntervalIn(TypedDict, total=False):
    """One host interval (core/model.py HostInterval)."""

    __pydantic_config__ = ConfigDict(extra="forbid", allow_inf_nan=False)  # type: ignore[misc]
    seq: Required[Seq]
    t0: Required[T]
    t1: Required[T]
    samples: Count
    cpu_s: NonNeg
    rss_max_b: Bytes
    read_b: Bytes
    write_b: Bytes
    threads_max: Count
    procs_max: Count
    sys_cpu_util_avg_pct: Pct | None
    iowait_s: NonNeg | None
    sys_mem_used_max_b: Bytes | None
    disk_read_b: Bytes | None
    disk_write_b: Bytes | None
    net_rx_b: Bytes | None
    net_tx_b: Bytes | None


class EventIn(_Strict):
    seq: Seq
    t: T
    kind: Annotated[str, Field(min_length=1, max_length=64)]
    message: Text = ""
    payload: dict[Short, Any] = Field(default_factory=dict)


class MetricIn(_Strict):
    seq: Seq
    t: T
    key: Annotated[str, Field(min_length=1, max_length=256)]
    value: Annotated[float, Field(allow_inf_nan=False)] | Literal["NaN", "Infinity", "-Infinity"]
    epoch: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    step: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None

    def float_value(self) -> float:
        return float(self.value)


class DeviceIn(_Strict):
    index: Annotated[int, Field(ge=0, le=4096)]
    uuid: Short
    name: Short
    pci_bus_id: Short | None = None
    memory_total_b: Bytes | None = None
    power_limit_w: Annotated[float, Field(ge=0, le=MAX_WATTS, allow_inf_nan=False)] | None = None
    driver_version: Short | None = None
    cuda_version: Short | None = None
    mig_mode: Short | None = None
    mig_parent_uuid: Short | None = None
    mig_profile: Short | None = None
    nvml_index: Annotated[int, Field(ge=0, le=4096)] | None = None
    source: Short = "nvml"


class RunIn(_Strict):
    id: RunId
    command: Annotated[list[Text], Field(max_length=4096)]
    user: Short
    host: Short
    cwd: Text
    started_at: T
    name: Annotated[str, Field(max_length=1024)] | None = None
    status: Status = "running"
    ended_at: T | None = None
    exit_code: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] | None = None
    signal: Annotated[int, Field(ge=0, le=255)] | None = None
    labels: Annotated[dict[Annotated[str, Field(min_length=1, max_length=128)], Text], Field(max_length=256)] = Field(
        default_factory=dict
    )
    git: dict[Short, Any] = Field(default_factory=dict)
    versions: dict[Short, Text] = Field(default_factory=dict)
    attempt_of: RunId | None = None
    replayed: bool = False
    interval_s: Annotated[float, Field(gt=0, le=86400, allow_inf_nan=False)] = 5.0
    recorder_pid: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    log_path: Text | None = None
    status_reason: Text | None = None
    gpu_note: Text | None = None
    meta: dict[Short, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> RunIn:
        if self.ended_at is not None and self.ended_at < self.started_at:
            raise ValueError(f"ended_at ({self.ended_at}) is before started_at ({self.started_at})")
        if self.status == "running" and self.ended_at is not None:
            raise ValueError("a running run has no ended_at")
        return self


class IngestBatch(_Strict):
    """One push from an agent: the run record (always) and any new rows. Idempotent: rows are
    keyed by (run, device, seq) / (run, seq); resending a batch changes nothing. ``final``: the
    agent has nothing more for this ended run (the server seals it in the audit trail)."""

    run: RunIn
    devices: Annotated[list[DeviceIn], Field(max_length=4096)] = Field(default_factory=list)
    gpu_intervals: list[GpuIntervalIn] = Field(default_factory=list)
    host_intervals: list[HostIntervalIn] = Field(default_factory=list)
    gpu_rows: list[GpuRow] = Field(default_factory=list, description=f"compact GPU intervals: {list(GPU_COLUMNS)}")
    host_rows: list[HostRow] = Field(default_factory=list, description=f"compact host intervals: {list(HOST_COLUMNS)}")
    events: list[EventIn] = Field(default_factory=list)
    metrics: list[MetricIn] = Field(default_factory=list)
    final: bool = False


class QuarantinedItem(BaseModel):
    """One row of the batch that was not stored: where it was, what it said it was, and why."""

    series: str  # gpu_rows, host_rows, gpu_intervals, host_intervals, events or metrics
    index: int  # its position in that list of the batch
    item: str  # "GPU-0 seq 7", "seq 3", or "#index" when the row did not say
    reason: str


class IngestResult(BaseModel):
    run_id: str
    created: bool
    gpu_intervals: int
    host_intervals: int
    events: int
    metrics: int
    dropped_rolled_up: int = 0
    sealed: bool = False
    quarantined: list[QuarantinedItem] = Field(
        default_factory=list, description="rows refused one by one (kept by the server, not stored with the run)"
    )
