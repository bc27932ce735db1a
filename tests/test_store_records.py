"""Record builders shared by the ledger tests (no tests here).

``full_*`` sets every field to a non-default value; ``minimal_*`` leaves every optional field None,
so a round trip checks both "stored exactly" and "absent stays absent".
"""

from __future__ import annotations

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord

T0 = 1_767_000_000.125  # an epoch time with a fractional part that must survive


def run_id(n: int, prefix: str = "0190abcd") -> str:
    """A UUIDv7-shaped id; runs made with the same ``prefix`` share their first characters."""
    return f"{prefix}-{n:04x}-7000-8000-{n:012x}"


def minimal_run(rid: str, started_at: float = T0, **kw: object) -> RunRecord:
    fields: dict = {"command": ["python", "train.py"], "user": "ana", "host": "gpu-01", "cwd": "/w", **kw}
    return RunRecord(id=rid, started_at=started_at, **fields)


def full_run(rid: str) -> RunRecord:
    return RunRecord(
        id=rid,
        command=["yolo", "train", "model=yolov8n.pt", "data=coco128.yaml", "épochs=3"],
        user="ana",
        host="gpu-01",
        cwd="/home/ana/proj",
        started_at=T0,
        name="yolo nano",
        status="failed",
        ended_at=T0 + 3600.5,
        exit_code=137,
        signal=9,
        labels={"project": "vision", "team": "perception", "model": "yolov8n", "dataset": "coco128"},
        git={"commit": "a" * 40, "branch": "main", "dirty": True},
        versions={"python": "3.11.7", "torch": "2.4.0", "cuda": "12.4", "driver": "550.54"},
        attempt_of=run_id(999),
        replayed=True,
        interval_s=1.0,
        recorder_pid=4242,
        log_path="/home/ana/.local/share/gpuledger/logs/x.log",
        status_reason="killed by SIGKILL (OOM killer?)",
        gpu_note="no NVML",
        meta={"hyp": {"lr0": 0.01, "imgsz": 640}, "weights": "yolov8n.pt"},
    )


def full_device(index: int = 0, uuid: str = "GPU-aaaa") -> GpuIdentity:
    return GpuIdentity(
        index=index,
        uuid=uuid,
        name="NVIDIA A100-SXM4-80GB",
        pci_bus_id="00000000:07:00.0",
        memory_total_b=85_899_345_920,
        power_limit_w=400.0,
        driver_version="550.54.15",
        cuda_version="12.4",
        mig_mode="enabled",
        mig_parent_uuid="GPU-parent",
        mig_profile="1g.10gb",
        nvml_index=3,
        source="nvidia-smi",
    )


def minimal_device(index: int = 1, uuid: str = "GPU-bbbb") -> GpuIdentity:
    return GpuIdentity(index=index, uuid=uuid, name="Tesla T4")


def full_gpu(uuid: str, seq: int, t0: float = T0) -> GpuInterval:
    return GpuInterval(
        device_uuid=uuid,
        seq=seq,
        t0=t0 + seq,
        t1=t0 + seq + 1,
        samples=6,
        busy_s=0.781,
        util_method="samples",
        util_max_pct=99.0,
        energy_j=312.5,
        energy_method="counter",
        power_max_w=351.25,
        mem_used_max_b=60_000_000_000 + seq,
        mem_used_last_b=59_000_000_000,
        mem_reserved_b=500_000_000,
        proc_mem_max_b=58_000_000_000,
        proc_sm_util_avg_pct=77.5,
        temp_max_c=71.0,
        sm_clock_avg_mhz=1410.0,
        mem_clock_max_mhz=1593.0,
        throttle_s={"power": 0.25, "thermal": 0.0},
    )


def minimal_gpu(uuid: str, seq: int, t0: float = T0) -> GpuInterval:
    return GpuInterval(device_uuid=uuid, seq=seq, t0=t0 + seq, t1=t0 + seq + 1)


def full_host(seq: int, t0: float = T0) -> HostInterval:
    return HostInterval(
        seq=seq,
        t0=t0 + seq,
        t1=t0 + seq + 1,
        samples=2,
        cpu_s=3.5,
        rss_max_b=12_000_000_000,
        read_b=5_000_000_000,
        write_b=1_000_000,
        threads_max=64,
        procs_max=9,
        sys_cpu_util_avg_pct=55.5,
        iowait_s=0.02,
        sys_mem_used_max_b=100_000_000_000,
        disk_read_b=6_000_000_000,
        disk_write_b=2_000_000,
        net_rx_b=3_000,
        net_tx_b=4_000,
    )


def minimal_host(seq: int, t0: float = T0) -> HostInterval:
    return HostInterval(seq=seq, t0=t0 + seq, t1=t0 + seq + 1)


def some_events(t0: float = T0) -> list[Event]:
    return [
        Event(t=t0 + 1, kind="epoch_end", message="epoch 1", payload={"epoch": 1, "nested": {"a": [1, 2]}}),
        Event(t=t0 + 2, kind="sampler_error", message="NVML: GPU lost"),
        Event(t=t0 + 3, kind="note"),
    ]


def some_metrics(t0: float = T0) -> list[Metric]:
    return [
        Metric(t=t0 + 1, key="loss", value=1.25, epoch=1, step=100),
        Metric(t=t0 + 2, key="mAP50", value=0.5),
        Metric(t=t0 + 3, key="lr", value=1e-3, step=7),
    ]
