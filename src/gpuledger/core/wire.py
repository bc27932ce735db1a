"""The column order of interval rows in the compact wire form (``gpu_rows`` / ``host_rows`` of
``POST /api/v1/ingest``): shared by the agent that writes them and the server that reads them."""

from __future__ import annotations

GPU_COLUMNS = (
    "device_uuid", "seq", "t0", "t1", "samples", "busy_s", "util_method", "util_max_pct", "energy_j",
    "energy_method", "power_max_w", "mem_used_max_b", "mem_used_last_b", "mem_reserved_b", "proc_mem_max_b",
    "proc_sm_util_avg_pct", "temp_max_c", "sm_clock_avg_mhz", "mem_clock_max_mhz", "throttle_s",
    # added later (migration 6): how busy time was covered, how the run's processes were found
    "util_idle_s", "util_unknown_s", "proc_method",
    # added later (migration 12): the exact unmeasured time
    "util_unmeasured_s",
)  # fmt: skip
# Older agents send the first GPU_COLUMNS_V1 columns (before the coverage columns) or the first
# GPU_COLUMNS_V2 (before util_unmeasured_s) only.
GPU_COLUMNS_V1 = GPU_COLUMNS[:20]
GPU_COLUMNS_V2 = GPU_COLUMNS[:23]
HOST_COLUMNS = (
    "seq", "t0", "t1", "samples", "cpu_s", "rss_max_b", "read_b", "write_b", "threads_max", "procs_max",
    "sys_cpu_util_avg_pct", "iowait_s", "sys_mem_used_max_b", "disk_read_b", "disk_write_b", "net_rx_b", "net_tx_b",
)  # fmt: skip
