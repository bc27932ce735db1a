"""What ``gpuledger db migrate --layout compact`` (store/series_compact.py) checks before it moves a
run's raw intervals out of the ledger: whether the run may move at all, and whether the series
store holds exactly the run's rows afterwards.

A run may move when it has ended, its rows match its seal (retention's rule: a tampered run is not
laundered into a fresh seal, an unsealed one waits for ``gpuledger audit seal``), retention never
thinned its rows into 1-minute or 1-hour rows (the seqs they replaced are gone, so segments could
not tell a late replay of them), and every raw day retention dropped of it was tiered into this
store and is still there (``run.raw_tiered``; series_tier.py): the store then holds every row the
run ever had.

The store's rows are checked as tiering checks a day (series_tier.differences): the rows the ledger
holds, per GPU and the host, by count, integer sums and a sha256 of the quantized rows; the rows of
tiered days the ledger dropped against their ``run.raw_tiered`` entries; and no other row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.series import quantum
from gpuledger.store import schema, series_only_verify, series_tier, tiered_totals
from gpuledger.store.partitions import DROPPED_LEVEL

Row = dict[str, Any]
DROPPED = "run.raw_dropped"  # store/retention_days.py


class CompactError(RuntimeError):
    """The series store does not hold exactly the run's rows: the run stays as it was."""


def why_not(conn: Connection, run_id: str, url: str) -> str | None:
    """Why the run's rows may not move into the store at ``url`` (as shown) yet; None when they may."""
    m = schema.rollup_marks.c
    levels = set(conn.scalars(sa.select(m.level_s).where(m.run_id == run_id)))
    thinned = sorted(level for level in levels if level < DROPPED_LEVEL)
    if thinned:
        return f"retention thinned its intervals to {thinned[-1]} s rows: kept in PostgreSQL"
    if not levels:
        return None
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == DROPPED)
    dropped = {str(json.loads(p)["day"]) for p in conn.scalars(q)}
    _, payloads = tiered_totals.dropped(conn, run_id)
    here = [p for p in payloads if p.get("series") == url]
    missing = sorted(dropped - {str(p["day"]) for p in here})
    if missing:
        return f"raw days {', '.join(missing)} were dropped without a copy in {url}: kept as it is"
    expired = sorted({str(p["day"]) for p in here if p.get("expired") and p["day"] in dropped})
    if expired:
        return f"its tiered days {', '.join(expired)} expired from {url}: kept as it is"
    return None


def dropped_parts(conn: Connection, run_id: str, url: str) -> list[Mapping[str, Any]]:
    """The ``run.raw_tiered`` entries into ``url`` of the run's days the ledger dropped since."""
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.object == f"run:{run_id}", a.action == DROPPED)
    dropped = {str(json.loads(p)["day"]) for p in conn.scalars(q)}
    _, payloads = tiered_totals.dropped(conn, run_id)
    return [p for p in payloads if p.get("series") == url and p["day"] in dropped]


def _in(seq_range: Sequence[int] | None, seq: int) -> bool:
    return seq_range is not None and seq_range[0] <= seq <= seq_range[1]


def check(
    run_id: str,
    gpu: Sequence[Mapping[str, Any]],
    host: Sequence[Mapping[str, Any]],
    stored_gpu: Sequence[Row],
    stored_host: Sequence[Row],
    parts: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """CompactError unless the store's rows of the run (``stored_*``, in (device, seq) and seq order)
    are exactly the quantized ledger rows (``gpu``, ``host``) and the dropped tiered days ``parts``;
    the summary (series_tier.day_summary) of all the store's rows of the run, and per day
    (series_only_verify.by_day): its seal."""
    held_gpu = {(str(r["device_uuid"]), int(r["seq"])) for r in gpu}
    held_host = {int(r["seq"]) for r in host}
    mine_gpu = [r for r in stored_gpu if (str(r["device_uuid"]), int(r["seq"])) in held_gpu]
    mine_host = [r for r in stored_host if int(r["seq"]) in held_host]
    expected = series_tier.day_summary([quantum.quantize_gpu(r) for r in gpu], [quantum.quantize_host(r) for r in host])
    found = series_tier.day_summary(mine_gpu, mine_host)
    problems = series_tier.differences(run_id, expected, found)
    covered = len(mine_gpu) + len(mine_host)
    for part in parts:  # days tiered, then dropped from the ledger: the store holds them alone
        ranges = {d: s["seq"] for d, s in part["gpu"].items()}
        host_range = part["host"]["seq"] if part.get("host") else None
        in_gpu = [r for r in stored_gpu if _in(ranges.get(str(r["device_uuid"])), int(r["seq"]))]
        in_host = [r for r in stored_host if _in(host_range, int(r["seq"]))]
        lines = series_tier.differences(run_id, part, series_tier.day_summary(in_gpu, in_host))
        problems += [f"{line} (tiered {part['day']})" for line in lines]
        covered += len(in_gpu) + len(in_host)
    extra = len(stored_gpu) + len(stored_host) - covered
    if extra > 0 and not problems:
        problems.append(f"run {run_id}: the series store holds {extra} rows of it the ledger never held")
    if problems:
        raise CompactError("; ".join(problems))
    whole = found if covered == len(mine_gpu) + len(mine_host) else series_tier.day_summary(stored_gpu, stored_host)
    # and per day, as a series-only push's seal (LiveSeries.summary): the days the store keeps stay
    # verifiable once its window has dropped the others (store/series_only_verify.py)
    return {**whole, "days": series_only_verify.by_day(stored_gpu, stored_host)}
