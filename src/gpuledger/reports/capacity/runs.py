"""The part of the fleet no node agent watches, derived from the runs recorded on it
(core/capacity/derive.py says what runs can and cannot tell), and what each team's runs were
billed in a window (the weights and the billed cost of the shared idle cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from gpuledger.core.capacity.derive import HeldDay, derive_days
from gpuledger.core.capacity.model import DAY_MS, FleetGpu, HostStay, ms
from gpuledger.core.capacity.report import TeamBill
from gpuledger.core.months import month_starts
from gpuledger.core.pricing.cost import Pricer, compact
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.core.pricing.usage import DAY_S, day_of
from gpuledger.reports.cost.usage import _periods, _run_rows, _trend_groups, _usages, interval_day_usage
from gpuledger.store import capacity_queries as capq
from gpuledger.store import cost_queries as cq

__all__ = ["runs_fleet", "runs_gpus", "team_bills", "whole_days"]


def runs_gpus(
    conn: Connection, start: float, end: float, *, replayed: bool = False
) -> tuple[list[FleetGpu], list[str]]:
    """(GPUs no agent has seen that are in the fleet in [start, end), the ids of the runs that used
    them then): each GPU from its first run's start to its last run's end (``end`` while one is
    open), whether or not a run used it in the window, on the host of its latest run started by
    the window's end, priced as that run's instance type. A replayed trace's GPUs (--replay-gpus)
    are no hardware: they and their runs count only with ``replayed``."""
    found = capq.unmetered_devices(conn, start, end, before=True, replayed=replayed)
    if not found:
        return [], []
    spans = capq.run_spans(conn, {u for _, u, _, _, _ in found}, replayed=replayed)
    present = {u for u, (first, last) in spans.items() if first < end and (last is None or last > start)}
    latest: dict[str, tuple[float, str, str, str]] = {}  # uuid -> (started_at, run id, host, name)
    for run_id, uuid, name, host, started in found:
        if uuid in present and (uuid not in latest or started > latest[uuid][0]):
            latest[uuid] = (started, run_id, host, str(name or uuid).split(" MIG ")[0])
    used = {r for r, _, _, _, _ in capq.unmetered_devices(conn, start, end, replayed=replayed)}  # runs in the window
    instances = cq.label_values(conn, "instance_type", sorted({v[1] for v in latest.values()}))
    gpus = []
    for uuid, (_, run_id, host, name) in sorted(latest.items()):
        first, last = spans.get(uuid, (latest[uuid][0], None))
        last = end if last is None else last
        instance = instances.get(run_id)
        stays = (HostStay(host, first, last, instance),)
        gpus.append(FleetGpu(uuid, name, host, first, last, stays, instance, None, "runs"))
    return gpus, sorted(used)


def runs_fleet(
    conn: Connection, card: RateCard, start: float, end: float, *, replayed: bool = False
) -> tuple[list[FleetGpu], list[tuple]]:
    """(GPUs known only from runs, their day rows in [start, end)): held and busy time from the runs'
    intervals (a shared GPU split between its runs, as the chargeback splits it); replayed runs'
    GPUs only with ``replayed``."""
    gpus, run_ids = runs_gpus(conn, start, end, replayed=replayed)
    if not gpus:
        return [], []
    runs = _run_rows(cq.run_rows(conn, scope=None, replayed=replayed, ids=run_ids), {})
    hosts = capq.run_hosts(conn, run_ids)
    days, devices = interval_day_usage(conn, list(runs.values()), start, end)
    held: dict[str, dict[int, HeldDay]] = {}
    for d in days:
        dev = devices.get((d.run_id, d.device_uuid), {})
        uuid = dev.get("mig_parent_uuid") or d.device_uuid
        fraction = _slice_fraction(card, dev)
        day = held.setdefault(uuid, {}).setdefault(d.day, HeldDay(host=hosts.get(d.run_id, "")))
        day.held_ms += d.alloc_s * 1000 * fraction
        if d.busy_s is None:
            day.unmeasured_ms += d.alloc_s * 1000 * fraction
        else:
            day.busy_ms += d.busy_s * 1000 * fraction
        if d.energy_j is not None:
            day.energy_j = (day.energy_j or 0.0) + d.energy_j * fraction
        a, b = ms(d.t0), ms(d.t1)
        day.first_ms = a if day.first_ms is None else min(day.first_ms, a)
        day.last_ms = b if day.last_ms is None else max(day.last_ms, b)
    window = (ms(start), ms(end))
    rows: list[tuple] = []
    for g in gpus:
        rows.extend(derive_days(g.uuid, g.host, (ms(g.first_seen), ms(g.last_seen)), held.get(g.uuid, {}), window))
    return gpus, rows


def _slice_fraction(card: RateCard, device: dict[str, Any]) -> float:
    """A MIG slice holds its profile's fraction of the GPU (3g.40gb of an A100: 3/7); 1 otherwise."""
    profile = device.get("mig_profile")
    if not profile:
        return 1.0
    fraction = card.models.mig_fraction(card.models.match(device.get("name")), profile)
    return 1.0 if fraction is None else float(fraction)


def team_bills(
    conn: Connection,
    card: RateCard,
    start: float,
    end: float,
    basis: str | None,
    key: str = "team",
    *,
    replayed: bool = False,
) -> list[TeamBill]:
    """What the runs of each team were billed in [start, end) and their allocated and busy hours.
    The chargeback's path for months it shows as a trend: rollup rows summed per team, GPU kind
    and price period in SQL, then priced; runs not rolled up priced from their intervals, and so
    are rolled-up runs on a day the price changes within while their intervals are there (as the
    chargeback reads such a day). A team's figure can differ from the chargeback's own in the last
    of its many decimal places. Replayed runs are billed nothing unless ``replayed``."""
    cut_times = sorted({start, end} | {t for t in card.change_points if start < t < end})
    period_days, periods = _periods(sorted({start, end, *month_starts(start, end), *cut_times}), cut_times)
    live = cq.unrolled_runs(conn, scope=None, replayed=replayed, start=start, end=end)
    live_ids = {r[0] for r in live}
    cut_days = {day_of(t) for t in cut_times if t % DAY_S}
    if cut_days:  # their busy time and energy are cut at the change exactly, as in the chargeback
        exact = cq.with_intervals(conn, sorted(cq.rolled_up_on(conn, sorted(cut_days)) - live_ids))
        if exact:
            live = [*live, *cq.run_rows(conn, scope=None, replayed=replayed, ids=sorted(exact))]
            live_ids |= exact
    last_day = day_of(end - 1e-6)
    groups = _trend_groups(
        conn, None, [key], day_of(start), last_day, live_ids, period_days, cut_days, replayed=replayed
    )
    pricer = Pricer(card, basis, start, end)
    out: dict[str | None, list[int]] = {}
    rows = [(str(i), g[2], g[3], g[1], *g[4:]) for i, g in enumerate(groups)]
    for row_id, _, _, _, _, v, _ in pricer.price_sums(rows, periods):
        _add(out, groups[int(row_id)][0], v)
    if live:
        runs = _run_rows(live, cq.label_values(conn, "instance_type", sorted(live_ids)))
        days, devices = interval_day_usage(conn, list(runs.values()), start, end, cut_times)
        for line in pricer.price_all(_usages(days, devices, runs)):
            _add(out, getattr(runs[line.run_id], key), compact(line)[5])
    # busy weights: measured busy hours, and held hours of GPUs that measure none (billed as busy)
    return [TeamBill(team, v[0], v[1] + v[2], v[5]) for team, v in out.items()]


def _add(out: dict[str | None, list[int]], team: str | None, v: Sequence[int]) -> None:
    acc = out.get(team)
    if acc is None:
        out[team] = list(v)
    else:
        for i, x in enumerate(v):
            acc[i] += x


def whole_days(start: float, end: float) -> bool:
    """Whether [start, end) starts and ends at UTC midnights (what the day sums can answer exactly)."""
    return ms(start) % DAY_MS == 0 and ms(end) % DAY_MS == 0
