"""A whole run folded into one interval per device (and one for the host), in SQL.

``gpuledger show`` needs the run's totals, not its rows: summing in the database keeps it fast
on runs of millions of intervals (72 h x 8 GPUs at 1 s), where decoding every row took minutes.
The merge rules are those of core/metering/intervals.py: integrals summed (None when never measured),
gauges max / last / time-weighted, methods joined.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.metering.intervals import merge_methods
from gpuledger.core.model import GpuInterval, HostInterval
from gpuledger.store import queries
from gpuledger.store.schema import gpu_intervals


def _weighted(col: Any, span: Any) -> Any:
    """Time-weighted mean over the intervals that measured ``col``."""
    return sa.func.sum(col * span) / sa.func.nullif(sa.func.sum(sa.case((col.is_not(None), span))), 0)


def _gpu_extras(conn: Connection, run_id: str) -> dict[str, dict[str, Any]]:
    g = gpu_intervals.c
    span = g.t1 - g.t0
    q = (
        sa.select(
            g.device_uuid,
            _weighted(g.sm_clock_avg_mhz, span).label("sm_clock_avg_mhz"),
            _weighted(g.proc_sm_util_avg_pct, span).label("proc_sm_util_avg_pct"),
            sa.func.max(g.seq).label("last_seq"),
        )
        .where(g.run_id == run_id)
        .group_by(g.device_uuid)
    )
    extras = {row.device_uuid: dict(row._mapping) for row in conn.execute(q)}
    for uuid, extra in extras.items():
        last = conn.execute(
            sa.select(g.mem_used_last_b, g.mem_reserved_b).where(
                g.run_id == run_id, g.device_uuid == uuid, g.seq == extra["last_seq"]
            )
        ).first()
        extra["mem_used_last_b"], extra["mem_reserved_b"] = (last[0], last[1]) if last else (None, None)
        methods = conn.execute(
            sa.select(g.util_method, g.energy_method, g.proc_method)
            .where(g.run_id == run_id, g.device_uuid == uuid)
            .group_by(g.util_method, g.energy_method, g.proc_method)
        ).all()
        extra["util_method"] = merge_methods(m[0] for m in methods)
        extra["energy_method"] = merge_methods(m[1] for m in methods)
        extra["proc_method"] = merge_methods(m[2] for m in methods)
        extra["throttle_s"] = _throttle_sum(conn, run_id, uuid)
    return extras


def _throttle_sum(conn: Connection, run_id: str, uuid: str) -> dict[str, float] | None:
    """Per-reason sums; stored as JSON, so added up here, reading only that column."""
    g = gpu_intervals.c
    rows = conn.execute(
        sa.select(g.throttle_s).where(g.run_id == run_id, g.device_uuid == uuid, g.throttle_s.is_not(None))
    )
    total: dict[str, float] | None = None
    for (value,) in rows:
        parsed = json.loads(value) if isinstance(value, str) else value
        if not isinstance(parsed, dict):
            continue
        total = total if total is not None else {}
        for reason, seconds in parsed.items():
            total[reason] = total.get(reason, 0.0) + float(seconds)
    return total


def gpu_rollups(conn: Connection, run_id: str) -> tuple[list[GpuInterval], dict[str, int]]:
    """One merged interval per device, and each device's interval count."""
    totals = queries.gpu_totals(conn, run_id)
    extras = _gpu_extras(conn, run_id)
    merged, counts = [], {}
    for uuid, t in totals.items():
        x = extras.get(uuid, {})
        counts[uuid] = t["count"]
        merged.append(
            GpuInterval(
                device_uuid=uuid, seq=0, t0=t["t0"], t1=t["t1"], samples=t["samples"] or 0,
                busy_s=t["busy_s"], util_method=x.get("util_method"), util_max_pct=t["util_max_pct"],
                util_idle_s=t["util_idle_s"], util_unknown_s=t["util_unknown_s"],
                util_unmeasured_s=t["util_unmeasured_s"], proc_method=x.get("proc_method"),
                energy_j=t["energy_j"], energy_method=x.get("energy_method"), power_max_w=t["power_max_w"],
                mem_used_max_b=t["mem_used_max_b"], mem_used_last_b=x.get("mem_used_last_b"),
                mem_reserved_b=x.get("mem_reserved_b"), proc_mem_max_b=t["proc_mem_max_b"],
                proc_sm_util_avg_pct=x.get("proc_sm_util_avg_pct"), temp_max_c=t["temp_max_c"],
                sm_clock_avg_mhz=x.get("sm_clock_avg_mhz"), mem_clock_max_mhz=t["mem_clock_max_mhz"],
                throttle_s=x.get("throttle_s"),
            )
        )  # fmt: skip
    return merged, counts


def host_rollup(conn: Connection, run_id: str) -> tuple[HostInterval | None, int]:
    """The host stream merged into one interval (None without host intervals), and its count."""
    t = queries.host_totals(conn, run_id)
    if not t["count"]:
        return None, 0
    merged = HostInterval(
        seq=0, t0=t["t0"], t1=t["t1"], samples=t["samples"] or 0, cpu_s=t["cpu_s"] or 0.0,
        rss_max_b=t["rss_max_b"] or 0, read_b=t["read_b"] or 0, write_b=t["write_b"] or 0,
        threads_max=t["threads_max"] or 0, procs_max=t["procs_max"] or 0,
        sys_cpu_util_avg_pct=t["sys_cpu_util_avg_pct"], iowait_s=t["iowait_s"],
        sys_mem_used_max_b=t["sys_mem_used_max_b"], disk_read_b=t["disk_read_b"], disk_write_b=t["disk_write_b"],
        net_rx_b=t["net_rx_b"], net_tx_b=t["net_tx_b"],
    )  # fmt: skip
    return merged, t["count"]
