"""Seals: a digest of one run's stored record, written into the audit chain (pure, no I/O).

A seal holds, per part of the run, enough to *name* what changed later:

- ``run``: a short hash per column of the run's row, and of its label rows and device rows;
- ``series``: per interval series (``gpu_intervals/<device uuid>``, ``host_intervals``): the seqs
  present (as ranges), the sums of its integrals, and row hashes, one per chunk of rows in seq
  order (chunks of one row while a series has at most MAX_HASHES rows);
- ``events`` / ``metrics``: count and one hash; ``log``: sha256 of the log itself, whichever form
  it is stored in (store/log_codec.py).

``compare(sealed, current)`` lists the differences as sentences naming the run, table, column,
device and seqs. Both sides must be built by ``seal`` from rows read the same way.

Two rules keep seals valid across gpuledger's own changes (no false alarms): derived columns
(``runs.rolled_up``: whether the cost rollups hold the run, rewritten by every rollup) are not
sealed; and a column added to a table after the first seal format (``SEALED_COLUMNS``) is hashed
only when it holds a value, so a migration that adds a NULL column leaves every seal as it was.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuledger.core.audit.chain import canonical_json

MAX_HASHES = 512
SHORT = 16  # hex chars kept of each hash
GPU_SUMS = ("samples", "busy_s", "energy_j")
HOST_SUMS = ("samples", "cpu_s", "read_b", "write_b")

Row = Mapping[str, Any]

DERIVED_RUN_COLUMNS = frozenset({"rolled_up"})


def _columns(names: str) -> frozenset[str]:
    return frozenset(names.split())


# The columns of each sealed table when seals were introduced (schema version 5).
SEALED_COLUMNS: dict[str, frozenset[str]] = {
    "runs": _columns(
        "id attempt_of name status command cwd user host started_at ended_at exit_code signal labels git versions "
        "meta replayed interval_s recorder_pid log_path status_reason gpu_note project team"
    ),
    "devices": _columns(
        "uuid index name pci_bus_id memory_total_b power_limit_w driver_version cuda_version mig_mode "
        "mig_parent_uuid mig_profile nvml_index source"
    ),
    "gpu_intervals": _columns(
        "device_uuid seq t0 t1 samples busy_s util_method util_max_pct energy_j energy_method power_max_w "
        "mem_used_max_b mem_used_last_b mem_reserved_b proc_mem_max_b proc_sm_util_avg_pct temp_max_c "
        "sm_clock_avg_mhz mem_clock_max_mhz throttle_s"
    ),
    "host_intervals": _columns(
        "seq t0 t1 samples cpu_s rss_max_b read_b write_b threads_max procs_max sys_cpu_util_avg_pct iowait_s "
        "sys_mem_used_max_b disk_read_b disk_write_b net_rx_b net_tx_b"
    ),
    "events": _columns("seq t kind message payload"),
    "metrics": _columns("seq t key value epoch step"),
}


def _h(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj).encode("utf-8")).hexdigest()[:SHORT]


def chunk_hash(rows: Sequence[Row]) -> str:
    """The hash of one chunk of a series' sealed rows (``sealed_row``), as ``seal_series`` keeps it."""
    return _h(rows)


def sealed_row(table: str, row: Row) -> dict[str, Any]:
    """The part of a row a seal covers: every column of the first format, later columns only when
    they hold a value, derived columns never."""
    out = dict(row)
    for key in out.keys() - SEALED_COLUMNS[table]:  # usually none, or a few: cheaper than a full filter
        if out[key] is None or (table == "runs" and key in DERIVED_RUN_COLUMNS):
            del out[key]
    return out


def ranges(seqs: Iterable[int]) -> list[list[int]]:
    """Sorted seqs as inclusive ranges: [0, 1, 2, 5] -> [[0, 2], [5, 5]]."""
    out: list[list[int]] = []
    for s in sorted(seqs):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return out


def expand(rs: Sequence[Sequence[int]]) -> list[int]:
    return [s for a, b in rs for s in range(a, b + 1)]


def _sum(values: Iterable[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) if known else None


def seal_series(rows: Sequence[Row], sums: Sequence[str], table: str = "gpu_intervals") -> dict[str, Any]:
    """Rows of one series, any order (sorted by seq here)."""
    rows = sorted(rows, key=lambda r: r["seq"])
    chunk = max(1, math.ceil(len(rows) / MAX_HASHES))
    hashes = [_h([sealed_row(table, r) for r in rows[i : i + chunk]]) for i in range(0, len(rows), chunk)]
    return {
        "n": len(rows),
        "seqs": ranges(r["seq"] for r in rows),
        "sums": {k: _sum(r.get(k) for r in rows) for k in sums},
        "chunk": chunk,
        "hashes": hashes,
    }


def seal(
    run: Row,
    labels: Sequence[Row],
    devices: Sequence[Row],
    gpu: Sequence[Row],
    host: Sequence[Row],
    events: Sequence[Row],
    metrics: Sequence[Row],
    log_sha256: str | None,
) -> dict[str, Any]:
    by_device: dict[str, list[Row]] = {}
    for r in gpu:
        by_device.setdefault(str(r["device_uuid"]), []).append(r)
    series = {f"gpu_intervals/{uuid}": seal_series(rs, GPU_SUMS) for uuid, rs in sorted(by_device.items())}
    if host:
        series["host_intervals"] = seal_series(host, HOST_SUMS, "host_intervals")
    return {
        "run": {k: _h(v) for k, v in sorted(sealed_row("runs", run).items())},
        "run_labels": _h(sorted((r["key"], r["value"]) for r in labels)),
        "devices": _h(sorted((sealed_row("devices", r) for r in devices), key=lambda d: str(d["uuid"]))),
        "series": series,
        "events": {
            "n": len(events),
            "h": _h(sorted((sealed_row("events", r) for r in events), key=lambda e: e["seq"])),
        },
        "metrics": {
            "n": len(metrics),
            "h": _h(sorted((sealed_row("metrics", r) for r in metrics), key=lambda m: m["seq"])),
        },
        "log": log_sha256,
    }


def _fmt(rs: Sequence[Sequence[int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in rs)


def _compare_series(
    name: str, old: Mapping[str, Any], cur: Mapping[str, Any] | None, rows_now: Sequence[Row]
) -> list[str]:
    table = name.split("/", 1)[0]
    if cur is None:
        return [f"{name}: all {old['n']} rows deleted"]
    out: list[str] = []
    old_seqs, cur_seqs = set(expand(old["seqs"])), set(expand(cur["seqs"]))
    if old_seqs - cur_seqs:
        out.append(f"{name}: rows seq {_fmt(ranges(old_seqs - cur_seqs))} deleted")
    if cur_seqs - old_seqs:
        out.append(f"{name}: rows seq {_fmt(ranges(cur_seqs - old_seqs))} inserted")
    by_seq = {r["seq"]: r for r in rows_now}
    ordered = sorted(old_seqs)
    chunk = int(old["chunk"])
    for i, want in enumerate(old["hashes"]):
        seqs = ordered[i * chunk : (i + 1) * chunk]
        if any(s not in by_seq for s in seqs):
            continue  # already reported as deleted
        if _h([sealed_row(table, by_seq[s]) for s in seqs]) != want:
            where = f"row seq {seqs[0]}" if len(seqs) == 1 else f"rows seq {seqs[0]}-{seqs[-1]}"
            out.append(f"{name}: {where} edited")
    for key, was in old["sums"].items():
        now = cur["sums"].get(key)
        if was != now and not (was is not None and now is not None and math.isclose(was, now, rel_tol=1e-12)):
            out.append(f"{name}: total {key} was {was}, now {now}")
    return out


def compare(sealed: Mapping[str, Any], current: Mapping[str, Any], rows_now: Mapping[str, Sequence[Row]]) -> list[str]:
    """What differs between a run's seal and its seal recomputed now. ``rows_now``: the current
    rows per series name, to locate edited rows."""
    if sealed == current:  # the common case: nothing to locate
        return []
    out: list[str] = []
    for col, h in sealed["run"].items():
        if col in DERIVED_RUN_COLUMNS:  # sealed by an older gpuledger
            continue
        if current["run"].get(col) != h:
            out.append(f"runs.{col} edited")
    for col in sorted(set(current["run"]) - set(sealed["run"])):
        out.append(f"runs.{col} added")
    for part in ("run_labels", "devices"):
        if sealed[part] != current[part]:
            out.append(f"{part} rows edited, inserted or deleted")
    for name, old in sealed["series"].items():
        out += _compare_series(name, old, current["series"].get(name), rows_now.get(name, ()))
    for name in sorted(set(current["series"]) - set(sealed["series"])):
        out.append(f"{name}: {current['series'][name]['n']} rows inserted (series not in the seal)")
    for part in ("events", "metrics"):
        old, now = sealed[part], current[part]
        if old["n"] != now["n"]:
            out.append(f"{part}: {old['n']} rows sealed, {now['n']} now")
        elif old["h"] != now["h"]:
            out.append(f"{part}: rows edited")
    if sealed["log"] != current["log"]:
        out.append("logs: the stored log changed" if current["log"] else "logs: the stored log was deleted")
    return out
