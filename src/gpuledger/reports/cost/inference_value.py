"""Inference value by model_version and week: cost per 1,000 images and energy per image of the
evaluation runs (issue 37), beside the training value trends (value_trends.py hooks it in).

An evaluation run (``yolo val|predict|benchmark``, ``meta.kind = evaluation``) counts for the
model_version of its ``model_version`` label, else of the training that produced the weights it
evaluated (run_lineage, store/lineage.py: only evaluations whose weights sha256 was recorded are
found, through that table's index). Its cost is priced as ``gpuledger cost`` prices a run (its
intervals, the rate card's basis): the whole run, model loading included. Energy per image is the
evaluation's own, over its evaluated window (``meta.evaluation.energy_j`` / images).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from gpuledger.core.chargeback.value_trends import week_label, week_start
from gpuledger.core.diagnosis.inference_rules import inference_slower, value_anomaly
from gpuledger.core.ids import short_id
from gpuledger.core.money import EXACT, MONEY_SCALE, money_str
from gpuledger.core.pricing.cost import Pricer
from gpuledger.reports.cost.run_rollups import collect_named, price_named
from gpuledger.reports.run import comparability
from gpuledger.store import lineage as store_lineage
from gpuledger.store import schema
from gpuledger.store.queries import open_run

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from gpuledger.core.pricing.ratecard import RateCard
    from gpuledger.store import Ledger

_Q = Decimal("0.000001")


def _visible(q: Any, scope: frozenset[str] | None, replayed: bool) -> Any:
    r = schema.runs.c
    q = q.where(~open_run(r), r.status != "imported")
    if scope is not None:
        q = q.where(r.project.in_(sorted(scope)) if scope else sa.false())
    return q if replayed else q.where(r.replayed == sa.false())


def evaluation_rows(
    conn: Connection, *, scope: frozenset[str] | None, start: float, end: float, replayed: bool = False
) -> list[dict[str, Any]]:
    """Finished evaluation runs in scope that ended in [start, end), with the model_version they count for."""
    r, lin, lab = schema.runs.c, schema.run_lineage, schema.run_labels
    producer = lin.alias("producer")
    made_by = (
        sa.select(producer.c.model_version)
        .where(producer.c.weights_sha256 == lin.c.weights_sha256, producer.c.kind == "training")
        .order_by(producer.c.started_at.desc())
        .limit(1)
        .scalar_subquery()
    )
    label = sa.select(lab.c.value).where(lab.c.run_id == r.id, lab.c.key == "model_version").limit(1).scalar_subquery()
    q = (
        sa.select(r.id, r.ended_at, r.meta, label.label("label_version"), made_by.label("made_by"))
        .select_from(schema.runs.join(lin, lin.c.run_id == r.id))
        .where(lin.c.kind == "evaluation", r.ended_at >= start, r.ended_at < end)
    )
    q = _visible(q, scope, replayed)
    rows = []
    for row in conn.execute(q).mappings():
        version = row["label_version"] or row["made_by"]
        if version:
            rows.append({"id": row["id"], "ended_at": float(row["ended_at"]), "meta": row["meta"], "version": version})
    return rows


def _per(amount: Decimal, divisor: Decimal) -> str | None:
    if divisor <= 0:
        return None
    return format(EXACT.divide(amount, divisor).quantize(_Q, ROUND_HALF_EVEN, EXACT), "f")


def cells(rows: Sequence[Mapping[str, Any]], costs: Mapping[str, int], weeks: Sequence[float]) -> list[dict[str, Any]]:
    """Per (model_version, week): evaluations, images, cost, cost per 1,000 images, energy and J/image.
    A figure needs every evaluation of the cell to have it (images, energy): a partial sum is not shown."""
    wanted = set(weeks)
    acc: dict[tuple[str, float], dict[str, Any]] = {}
    for row in rows:
        week = week_start(row["ended_at"])
        if week not in wanted:
            continue
        ev = (row["meta"] or {}).get("evaluation") or {}
        cell = acc.setdefault(
            (row["version"], week),
            {"evaluations": 0, "images": 0, "cost": 0, "energy_j": 0.0, "images_known": True, "energy_known": True},
        )
        cell["evaluations"] += 1
        cell["cost"] += costs.get(row["id"], 0)
        images, energy = ev.get("images"), ev.get("energy_j")
        if isinstance(images, int) and images > 0:
            cell["images"] += images
        else:
            cell["images_known"] = False
        if isinstance(energy, int | float):
            cell["energy_j"] += float(energy)
        else:
            cell["energy_known"] = False
    out = []
    for (version, week), c in sorted(acc.items()):
        images = c["images"] if c["images_known"] else None
        energy = c["energy_j"] if c["energy_known"] else None
        amount = Decimal(c["cost"]).scaleb(-MONEY_SCALE, EXACT)
        out.append(
            {
                "model_version": version,
                "week": week_label(week),
                "evaluations": c["evaluations"],
                "images": images,
                "cost": money_str(c["cost"]),
                "cost_per_1k_images": None if not images else _per(amount, Decimal(images) / 1000),
                "energy_j": None if energy is None else round(energy, 6),
                "j_per_image": None if energy is None or not images else round(energy / images, 6),
            }
        )
    return out


def inference_value(
    ledger: Ledger,
    *,
    scope: frozenset[str] | None,
    card: RateCard,
    weeks: Sequence[float],
    end: float,
    basis: str | None = None,
    include_replayed: bool = False,
) -> list[dict[str, Any]]:
    """The inference cells of ``weeks`` (week starts; the last counted up to ``end``)."""
    if not weeks:
        return []

    def read(conn: Connection) -> tuple[list[dict[str, Any]], Any]:
        rows = evaluation_rows(conn, scope=scope, start=weeks[0], end=end, replayed=include_replayed)
        # Rolled-up evaluations from their rollups, as the chargeback prices them (run_rollups.py).
        usage = collect_named(conn, [r["id"] for r in rows], cuts=card.change_points) if rows else None
        return rows, usage

    rows, usage = ledger.read(read)
    costs: dict[str, int] = {}
    if usage is not None:
        for run_id, *_, amounts, _flags in price_named(Pricer(card, basis), usage):
            costs[run_id] = costs.get(run_id, 0) + amounts[5]  # cost, AMOUNTS order (core/pricing/cost.py)
    return cells(rows, costs, weeks)


def _evaluations_of(conn: Connection, sha: str, scope: frozenset[str] | None, replayed: bool) -> list[dict[str, Any]]:
    """Every finished evaluation of the weights ``sha`` the reader may see."""
    r, lin = schema.runs.c, schema.run_lineage
    q = (
        sa.select(r.id, r.ended_at, r.meta)
        .select_from(schema.runs.join(lin, lin.c.run_id == r.id))
        .where(lin.c.kind == store_lineage.EVALUATION, lin.c.weights_sha256 == sha)
    )
    return [dict(row) for row in conn.execute(_visible(q, scope, replayed).order_by(r.ended_at)).mappings()]


def _compared(ledger: Ledger, row: Mapping[str, Any]) -> dict[str, Any]:
    """An evaluation as inference_slower reads it: its ms/image and the conditions it ran under."""
    ev = (row["meta"] or {}).get("evaluation") or {}
    ms = ev.get("ms_per_image") if isinstance(ev.get("ms_per_image"), Mapping) else {}
    gpus = [{"name": g.name, "power_limit_w": g.power_limit_w, "driver_version": g.driver_version,
             "cuda_version": g.cuda_version} for g in ledger.devices(row["id"])]  # fmt: skip
    return {
        "run_id": row["id"],
        "ended_at": float(row["ended_at"]),
        "inference_ms": ms.get("inference"),
        "conditions": comparability.facts(ev, gpus),
    }


def _comparable(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return comparability.verdict(a["conditions"], b["conditions"]).comparable


def slower_anomalies(
    ledger: Ledger,
    *,
    scope: frozenset[str] | None,
    weeks: Sequence[float],
    end: float,
    by: str = "model_version",
    include_replayed: bool = False,
) -> list[dict[str, Any]]:
    """One anomaly per model_version evaluated in ``weeks`` (up to ``end``) whose inference is
    slower than its previous version's on a comparable evaluation; worst slowdown first."""
    if not weeks:
        return []

    def read(conn: Connection) -> list[tuple[str, dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]]:
        rows = evaluation_rows(conn, scope=scope, start=weeks[0], end=end, replayed=include_replayed)
        mine: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            mine.setdefault(row["version"], []).append(row)
        out = []
        for version, evals in sorted(mine.items()):
            training = store_lineage.by_version(conn, version)
            parent_id = training and training["parent_run"]
            parent = store_lineage.get(conn, parent_id) if parent_id else None
            if training is None or parent is None or not parent["weights_sha256"]:
                continue
            before = _evaluations_of(conn, parent["weights_sha256"], scope, include_replayed)
            out.append(({**training, "version": version}, parent, evals, before))
        return out

    found: list[tuple[float, dict[str, Any]]] = []
    for training, parent, evals, before in ledger.read(read):
        now = [_compared(ledger, r) for r in evals]
        slower = inference_slower(
            training["run_id"], parent["run_id"], now, [_compared(ledger, r) for r in before], _comparable
        )
        if slower is None:
            continue
        ev = next(e for e in now if e["run_id"] == slower.evaluation)
        anomaly = value_anomaly(
            slower,
            by=by,
            version=training["version"],
            previous_version=parent["model_version"] or short_id(parent["run_id"]),
            week=week_label(week_start(ev["ended_at"])),
            conditions=ev["conditions"],
        )
        found.append((slower.slowdown_pct, anomaly))
    return [a for _, a in sorted(found, key=lambda f: -f[0])]
