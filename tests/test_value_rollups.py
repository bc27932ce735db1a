"""Value trends and the /metrics value gauges price rolled-up runs from their rollups, as the
chargeback does, with the same money and GPU-hours per run as reading every run's raw intervals
(SQLite and PostgreSQL): two GPUs of one model (one measuring no busy time), a price change inside a
day, a run across a month's end, two runs sharing a GPU, and a run whose rollups a later write
dropped (read from its intervals). For rolled-up runs no ``gpu_intervals`` row is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from cost_support import H, card, price_change, ts
from gpuledger.core.chargeback.value_trends import RunValue
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.core.pricing.cost import Pricer
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.prom.value_source import ValueSource
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.reports.cost.usage import collect_runs
from gpuledger.reports.cost.value_trends import run_values, value_trends
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, accounts, rollup_stale

A100 = "NVIDIA A100-SXM4-40GB"
START, END = ts("2026-03-01"), ts("2026-04-06")
NOW = ts("2026-04-02")  # the gauges' clock: every run ended within their (widened) window
GAUGE_WINDOW_S = 40 * 86400.0
CARD_FILE = """[card]
currency = "USD"
basis = "busy"

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "3.00"
effective_to = 2026-03-11T21:00:00

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "1.00"
effective_from = 2026-03-11T21:00:00
"""
ROLLED = ("two-gpus", "change", "month-end", "share-1", "share-2", "midnight")


def _card(basis: str) -> RateCard:
    # 3.00 an hour until 21:00 on March 11th (a change inside a day), 1.00 until midnight of March
    # 14th, 2.00 after (a change at midnight, between two rollup rows of 'midnight').
    model = 'model = "A100-40GB-SXM"'
    return card(
        f'[[gpu]]\n{model}\nprice_per_hour = "3.00"\neffective_to = 2026-03-11T21:00:00\n\n'
        f'[[gpu]]\n{model}\nprice_per_hour = "1.00"\neffective_from = 2026-03-11T21:00:00\n'
        "effective_to = 2026-03-14T00:00:00\n\n"
        f'[[gpu]]\n{model}\nprice_per_hour = "2.00"\neffective_from = 2026-03-14T00:00:00\n',
        basis=basis,
    )


def _run(led: Ledger, rid: str, start: str, hours: int, gpus: dict[str, list[float | None]], model: str) -> None:
    """A finished, model-labelled run; ``gpus``: uuid -> busy share of each hour (None: unmeasured)."""
    t0 = ts(start)
    labels = {"project": "det", "team": "vision", "model": model, "model_version": f"{model}-v1"}
    led.create_run(RunRecord(id=rid, command=["train"], user="ana", host="h", cwd="/", started_at=t0,
                             status="succeeded", ended_at=t0 + hours * H, labels=labels))  # fmt: skip
    led.add_devices(rid, [GpuIdentity(i, uuid, A100) for i, uuid in enumerate(gpus)])
    ivs = [
        GpuInterval(uuid, h, t0 + h * H, t0 + (h + 1) * H, busy_s=None if b is None else b * H, energy_j=250.0 * H)
        for uuid, busy in gpus.items()
        for h, b in enumerate(busy)
    ]
    led.append(rid, gpu=ivs)


def _seed(ledger: Ledger) -> None:
    _run(ledger, "two-gpus", "2026-03-10T00:00", 6, {"GPU-a0": [0.5] * 6, "GPU-a1": [None] * 6}, "yolov5m")
    _run(ledger, "change", "2026-03-11T18:00", 8, {"GPU-b": [1, 1, 1, 0, 0.5, 0.5, 0.25, 1]}, "yolov5m")
    _run(ledger, "month-end", "2026-03-31T22:00", 4, {"GPU-c": [0.75] * 4}, "yolo11n")
    _run(ledger, "share-1", "2026-03-12T10:00", 4, {"GPU-s": [0.5] * 4}, "yolo11n")
    _run(ledger, "share-2", "2026-03-12T12:00", 4, {"GPU-s": [0.5] * 4}, "rtdetr")
    _run(ledger, "midnight", "2026-03-13T22:00", 4, {"GPU-m": [1, 0.5, 0.5, 0.25]}, "yolo11n")
    _run(ledger, "late", "2026-03-11T20:00", 3, {"GPU-l": [0.9] * 3}, "rtdetr")


@pytest.fixture
def led(ledger_url: str) -> Iterator[Ledger]:
    with Ledger(ledger_url) as ledger:
        _seed(ledger)
        yield ledger


def _ids(led: Ledger) -> list[str]:
    return [v.run_id for v in run_values(led, scope=None, card=_card("busy"), start=START, end=END)]


def _raw_reference(led: Ledger, card: RateCard) -> dict[str, tuple[int, ...]]:
    """Each run priced from its raw intervals, GPU by GPU, as value trends priced every run before
    (collect_runs, then the pricer line by line): cost, idle cost, held, busy and measured µh."""
    ids = _ids(led)
    usage = led.read(lambda conn: collect_runs(conn, ids, scope=None, cuts=card.change_points))
    out: dict[str, list[int]] = {rid: [0, 0, 0, 0, 0] for rid in ids}
    for ln in Pricer(card).price_all(usage.usages):
        acc = out[ln.run_id]
        for i, x in enumerate((ln.cost, ln.idle_cost, ln.alloc_uh, ln.busy_uh, ln.alloc_uh - ln.unmeasured_uh)):
            acc[i] += x
    return {rid: tuple(v) for rid, v in out.items()}


def _figures(values: list[RunValue]) -> dict[str, tuple[int, ...]]:
    return {v.run_id: (v.cost, v.idle_cost, v.alloc_uh, v.busy_uh, v.measured_uh) for v in values}


def _roll_up_all_but_late(led: Ledger) -> None:
    materialise_rollups(led)
    led.write(lambda conn: rollup_stale.drop_rollups(conn, ["late"]))  # as a late write would


def _rolled_up(led: Ledger) -> set[str]:
    return set(led.read(lambda conn: conn.scalars(sa.text("SELECT DISTINCT run_id FROM gpu_rollups")).all()))


@pytest.mark.parametrize("basis", ["busy", "allocated"])
def test_value_per_run_is_the_same_priced_from_rollups_as_from_raw_rows(led: Ledger, basis: str) -> None:
    card = _card(basis)
    before = run_values(led, scope=None, card=card, start=START, end=END)
    trends_before = value_trends(led, scope=None, card=card, end=END, weeks=5).as_dict()
    _roll_up_all_but_late(led)
    assert _rolled_up(led) == {*ROLLED}
    after = run_values(led, scope=None, card=card, start=START, end=END)
    assert after == before
    assert _figures(after) == _raw_reference(led, card)
    assert {v.run_id: v.settings["gpu_model"] for v in after} == dict.fromkeys(_ids(led), "A100-40GB-SXM")
    assert value_trends(led, scope=None, card=card, end=END, weeks=5).as_dict() == trends_before


def test_the_price_change_day_is_cut_at_the_change_not_in_proportion(led: Ledger) -> None:
    # 'change', busy basis, 18:00-02:00: 18:00-21:00 fully busy at 3.00 (9.00), 21:00-24:00 0 + 0.5
    # + 0.5 busy h at 1.00 (1.00), March 12th 0.25 + 1 busy h at 1.00 (1.25): 11.25 for 5.25 busy h.
    # March 11th's rollup row cut in proportion to held time would bill its 4 busy h half at 3.00.
    card = _card("busy")
    _roll_up_all_but_late(led)
    value = {v.run_id: v for v in run_values(led, scope=None, card=card, start=START, end=END)}["change"]
    assert value.cost == 1125 * 10**19
    assert value.busy_uh == 5_250_000


def _gauges(led: Ledger, card: RateCard) -> list[Any]:
    return ValueSource(led, card, recent_s=GAUGE_WINDOW_S, clock=lambda: NOW).figures()


def test_the_metrics_value_gauges_are_the_same_from_rollups(led: Ledger) -> None:
    card = _card("allocated")
    before = _gauges(led, card)
    _roll_up_all_but_late(led)
    after = _gauges(led, card)
    assert len(after) == 7 and after == before


def test_rolled_up_runs_are_priced_without_reading_gpu_intervals(tmp_path: Path) -> None:
    # SQLite: on PostgreSQL the large reads bypass SQLAlchemy's events (cost_queries._fetch).
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        _seed(led)
        _roll_up_all_but_late(led)
        _assert_reads(led)


def _assert_reads(led: Ledger) -> None:
    flat = price_change("A100-40GB-SXM", "2026-03-20T00:00:00", "3.00", "1.00")  # at midnight: no day to cut
    reads: list[tuple[str, str]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_rest: Any) -> None:
        if "gpu_intervals" in statement:
            reads.append((statement, repr(parameters)))

    def runs_read() -> set[str]:
        """The runs whose ids the reads of gpu_intervals were bound to."""
        return {rid for _, params in reads for rid in (*ROLLED, "late") if repr(rid) in params}

    sa.event.listen(led.database.engine, "before_cursor_execute", seen)
    try:
        assert len(run_values(led, scope=None, card=flat, start=START, end=END)) == 7
        assert reads and runs_read() == {"late"}  # the run not rolled up, by its key; none of the others
        reads.clear()
        assert len(ValueSource(led, flat, recent_s=GAUGE_WINDOW_S, clock=lambda: NOW).figures()) == 7
        assert runs_read() == {"late"}
        reads.clear()
        # A price change inside March 11th: the rolled-up run of that day is read for that day only.
        run_values(led, scope=None, card=_card("busy"), start=START, end=END)
        assert runs_read() == {"late", "change"}
    finally:
        sa.event.remove(led.database.engine, "before_cursor_execute", seen)


def test_the_server_value_trends_route_answers_the_same_from_rollups(ledger_url: str, tmp_path: Path) -> None:
    # GET /api/v1/reports/value-trends (real app, the server's rate card), before and after a rollup pass.
    rates = tmp_path / "rates.toml"
    rates.write_text(CARD_FILE)
    with Ledger(ledger_url) as ledger:
        _seed(ledger)
        accounts.add_project(ledger, "det", actor="test")
        _, token = accounts.issue_token(ledger, "root", role="admin", actor="test", create_user=True)

    def trends() -> dict[str, Any]:
        with TestClient(create_app(ledger_url, settings=Settings(rates=str(rates)))) as client:
            got = client.get("/api/v1/reports/value-trends?month=2026-03", headers={"Authorization": f"Bearer {token}"})
        assert got.status_code == 200, got.text
        return got.json()

    before = trends()
    with Ledger(ledger_url) as ledger:
        _roll_up_all_but_late(ledger)
        assert _rolled_up(ledger) == {*ROLLED}
    assert trends() == before and before["runs"] == 6  # month-end ended in April
