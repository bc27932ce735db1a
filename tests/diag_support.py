"""Synthetic runs for the diagnosis and report tests: intervals built from per-interval functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuledger.core.diagnosis.diagnose import Trace
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord

GIB = 2**30
T0 = 1_760_000_000.0


def device(index: int = 0, memory_gib: int = 80, name: str = "NVIDIA A100-SXM4-80GB") -> GpuIdentity:
    return GpuIdentity(
        index=index, uuid=f"GPU-test-{index}", name=name, memory_total_b=memory_gib * GIB, power_limit_w=400.0
    )


def gpu_intervals(
    uuid: str,
    n: int,
    step: float = 5.0,
    start: float = T0,
    util: Callable[[int], float] = lambda i: 0.9,
    mem_gib: Callable[[int], float] = lambda i: 30.0,
    proc_gib: Callable[[int], float | None] | None = None,
    throttle: Callable[[int], dict[str, float] | None] = lambda i: {},
    temp: Callable[[int], float] = lambda i: 60.0,
) -> list[GpuInterval]:
    out = []
    for i in range(n):
        t0 = start + i * step
        proc = proc_gib(i) if proc_gib else None
        out.append(
            GpuInterval(
                device_uuid=uuid,
                seq=i,
                t0=t0,
                t1=t0 + step,
                samples=int(step),
                busy_s=util(i) * step,
                util_method="samples",
                util_max_pct=util(i) * 100,
                energy_j=300 * step,
                energy_method="counter",
                power_max_w=100 + 250 * util(i),
                mem_used_max_b=int(mem_gib(i) * GIB),
                mem_used_last_b=int(mem_gib(i) * GIB),
                proc_mem_max_b=None if proc is None else int(proc * GIB),
                temp_max_c=temp(i),
                sm_clock_avg_mhz=1410.0,
                throttle_s=throttle(i),
            )
        )
    return out


def host_intervals(
    n: int,
    step: float = 5.0,
    start: float = T0,
    cores: Callable[[int], float] = lambda i: 2.0,
    procs: int = 6,
    iowait: Callable[[int], float | None] = lambda i: 0.0,
    sys_cpu: Callable[[int], float | None] = lambda i: 30.0,
) -> list[HostInterval]:
    return [
        HostInterval(
            seq=i,
            t0=start + i * step,
            t1=start + (i + 1) * step,
            samples=int(step),
            cpu_s=cores(i) * step,
            rss_max_b=4 * GIB,
            read_b=0,
            write_b=0,
            threads_max=20,
            procs_max=procs,
            sys_cpu_util_avg_pct=sys_cpu(i),
            iowait_s=None if iowait(i) is None else iowait(i) * step,
            sys_mem_used_max_b=40 * GIB,
            disk_read_b=int(50e6 * step),
            disk_write_b=int(1e6 * step),
            net_rx_b=int(2e6 * step),
            net_tx_b=int(1e5 * step),
        )
        for i in range(n)
    ]


def epoch_events(n_epochs: int, epoch_s: float, start: float = T0) -> list[Event]:
    out = []
    for e in range(1, n_epochs + 1):
        out.append(Event(start + (e - 1) * epoch_s, "epoch_start", payload={"epoch": e}))
        out.append(Event(start + e * epoch_s, "epoch_end", payload={"epoch": e}))
    return out


def make_trace(
    devices: list[GpuIdentity],
    gpu: dict[str, list[GpuInterval]],
    host: list[HostInterval] | None = None,
    events: list[Event] | None = None,
    metrics: list[Metric] | None = None,
    status: str = "succeeded",
    reason: str | None = None,
    cores: int | None = 8,
    meta: dict[str, Any] | None = None,
    **kw: Any,
) -> Trace:
    ends = [iv.t1 for ivs in gpu.values() for iv in ivs] + [h.t1 for h in host or []]
    end = max(ends) if ends else T0 + 60
    run = RunRecord(
        id="0190aaaa-0000-7000-8000-000000000001",
        command=["python", "train.py"],
        user="u",
        host="h",
        cwd="/",
        started_at=T0,
        status=status,
        ended_at=end,
        status_reason=reason,
        meta=meta or {},
    )
    return Trace(
        run=run,
        devices=devices,
        gpu=gpu,
        host=host or [],
        events=events or [],
        metrics=metrics or [],
        end=end,
        cpu_cores=cores,
        **kw,
    )
