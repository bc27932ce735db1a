"""Cost reports over a real ledger (SQLite and PostgreSQL): shared GPUs, MIG, killed and resumed
runs, month boundaries, scope, and the same figures whether read from intervals or rollups."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy as sa

from cost_support import H, card, ts
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.reports.cost.costing import chargeback, month_window, run_costs
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.store import Ledger, schema
from gpuledger.store import migrations as mig
from gpuledger.store.engine import Database
from gpuledger.store.rollup_writes import GROUPING_COLUMNS

CARD = card(
    """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"
"""
)
A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"


def _run(
    led: Ledger,
    rid: str,
    start: str,
    end: str | None,
    *,
    status: str = "succeeded",
    team: str = "vision",
    project: str = "det",
    user: str = "ana",
    attempt_of: str | None = None,
) -> float:
    t0 = ts(start)
    led.create_run(
        RunRecord(
            id=rid,
            command=["train"],
            user=user,
            host="h",
            cwd="/",
            started_at=t0,
            status=status,
            ended_at=ts(end) if end else None,
            labels={"team": team, "project": project},
            attempt_of=attempt_of,
        )
    )
    return t0


def _intervals(
    led: Ledger,
    rid: str,
    uuid: str,
    t0: float,
    t1: float,
    util: float | None,
    *,
    step: float = 600.0,
    sm: float | None = None,
    watts: float | None = 300.0,
    offset: float = 0.0,
) -> None:
    out, t, seq = [], t0 + offset, 0
    while t < t1:
        b = min(t1, t + step)
        out.append(
            GpuInterval(
                device_uuid=uuid,
                seq=seq,
                t0=t,
                t1=b,
                busy_s=None if util is None else (b - t) * util,
                energy_j=None if watts is None else (b - t) * watts,
                proc_sm_util_avg_pct=sm,
            )
        )
        t, seq = b, seq + 1
    led.append(rid, gpu=out)


def scenario(led: Ledger) -> None:
    t = _run(led, "solo", "2026-03-10T00:00", "2026-03-10T06:00")
    led.add_devices("solo", [GpuIdentity(0, "GPU-solo", A100_40)])
    _intervals(led, "solo", "GPU-solo", t, t + 6 * H, 0.78)

    # Two runs on one GPU, overlapping 13:00-14:00; A's processes use 60 % of the SMs, B's 30 %.
    a = _run(led, "shared-a", "2026-03-11T12:00", "2026-03-11T14:00", team="nlp", project="llm", user="bo")
    b = _run(led, "shared-b", "2026-03-11T13:00", "2026-03-11T15:00", team="nlp", project="secret", user="zora")
    led.add_devices("shared-a", [GpuIdentity(0, "GPU-shared", A100_80)])
    led.add_devices("shared-b", [GpuIdentity(0, "GPU-shared", A100_80)])
    _intervals(led, "shared-a", "GPU-shared", a, a + 2 * H, 0.9, sm=60.0)
    _intervals(led, "shared-b", "GPU-shared", b, b + 2 * H, 0.9, sm=30.0)

    m = _run(led, "mig", "2026-03-12T00:00", "2026-03-12T07:00", team="vision", project="det", user="ana")
    led.add_devices("mig", [GpuIdentity(0, "MIG-abc", A100_80, mig_parent_uuid="GPU-par", mig_profile="3g.40gb")])
    _intervals(led, "mig", "MIG-abc", m, m + 7 * H, None, watts=None)  # MIG: no utilisation reading

    k = _run(led, "killed", "2026-03-20T00:00", "2026-03-20T10:00", status="killed")
    led.add_devices("killed", [GpuIdentity(0, "GPU-k", A100_40)])
    _intervals(led, "killed", "GPU-k", k, k + 4 * H, 0.5)  # the recorder stopped hearing from it at 04:00

    c = _run(led, "cross", "2026-03-31T22:00", "2026-04-01T02:00", team="ops", project="det", user="dee")
    led.add_devices("cross", [GpuIdentity(0, "GPU-c", A100_40)])
    _intervals(led, "cross", "GPU-c", c, c + 4 * H, 1.0, offset=-300.0)  # intervals straddle midnight

    s1 = _run(led, "att1", "2026-03-05T00:00", "2026-03-05T02:00", status="failed", user="eve")
    s2 = _run(led, "att2", "2026-03-05T03:00", "2026-03-05T05:00", user="eve", attempt_of="att1")
    led.add_devices("att1", [GpuIdentity(0, "GPU-r", A100_40)])
    led.add_devices("att2", [GpuIdentity(0, "GPU-r", A100_40)])
    _intervals(led, "att1", "GPU-r", s1, s1 + 2 * H, 0.5)
    _intervals(led, "att2", "GPU-r", s2, s2 + 2 * H, 0.5)


@pytest.fixture
def ledger(ledger_url: str) -> Ledger:
    led = Ledger(ledger_url)
    scenario(led)
    yield led
    led.close()


def _report(led: Ledger, scope=None, by=("team",), basis="busy"):  # type: ignore[no-untyped-def]
    lo, hi = month_window("2026-03")
    return chargeback(led, scope=scope, card=CARD, start=lo, end=hi, by=by, basis=basis, trend_months=1)


def _runs_by_id(led: Ledger, ids: list[str], scope=None, basis="busy"):  # type: ignore[no-untyped-def]
    report = run_costs(led, ids, scope=scope, card=CARD, basis=basis)
    return {r["run_id"]: r for r in report["runs"]}


def test_hand_computed_runs_in_the_ledger(ledger: Ledger) -> None:
    runs = _runs_by_id(ledger, ["solo", "shared-a", "shared-b", "mig", "killed", "cross", "att2"], basis="allocated")
    solo = runs["solo"]["total"]
    assert (solo["allocated_gpu_h"], solo["busy_gpu_h"], solo["cost"]) == (6.0, 4.68, "15.00")
    busy = _runs_by_id(ledger, ["solo"])["solo"]["total"]
    assert busy["cost"] == "11.70"  # the seed case, through the ledger

    a, b = runs["shared-a"]["total"], runs["shared-b"]["total"]
    assert a["allocated_gpu_h"] == pytest.approx(1 + 2 / 3, abs=1e-6)  # alone 1 h + 2/3 of the shared hour
    assert b["allocated_gpu_h"] == pytest.approx(1 + 1 / 3, abs=1e-6)
    assert a["busy_gpu_h"] == pytest.approx(0.9 + 0.6, abs=1e-6)  # 0.9 busy x 60/90 in the shared hour
    assert b["busy_gpu_h"] == pytest.approx(0.9 + 0.3, abs=1e-6)
    assert a["allocated_gpu_h"] + b["allocated_gpu_h"] == pytest.approx(3.0, abs=2e-6)  # the GPU's 3 h, billed once
    assert "shared:sm" in a["flags"] and "shared:sm" in b["flags"]

    m = runs["mig"]["total"]
    assert m["allocated_gpu_h"] == 3.0 and m["unmeasured_gpu_h"] == 3.0 and m["cost"] == "10.29"  # 7 h x 3/7 x 3.43
    assert "mig" in m["flags"] and "busy_unmeasured" in m["flags"]

    k = runs["killed"]
    assert k["partial"] and k["total"]["allocated_gpu_h"] == 4.0 and "killed" in k["total"]["flags"]

    assert runs["cross"]["total"]["allocated_gpu_h"] == pytest.approx(4.0)
    logical = runs["att2"]["logical_run"]
    assert logical["attempts"] == ["att1", "att2"] and logical["allocated_gpu_h"] == 4.0 and logical["cost"] == "10.00"


def test_chargeback_by_team_with_month_boundary_and_attempts(ledger: Ledger) -> None:
    cb = _report(ledger)
    groups = {g["team"]: g for g in cb.groups}
    assert groups["ops"]["allocated_gpu_h"] == pytest.approx(2.0, abs=1e-6)  # 22:00-24:00 of the cross run
    assert groups["ops"]["busy_gpu_h"] == pytest.approx(2.0, abs=1e-6)
    vision = groups["vision"]
    # solo, mig, killed, and att1+att2 as one logical run
    assert vision["runs"] == 4 and vision["attempts"] == 5 and vision["partial_runs"] == 2
    assert sum(Decimal(g["cost"]) for g in cb.groups) == Decimal(cb.total["cost"])
    top = {r["run_id"]: r for r in cb.top_runs_by_cost}
    assert top["att1"]["attempts"] == 2 and top["att1"]["status"] == "succeeded"
    assert Decimal(top["att1"]["cost"]) == Decimal("5.00")  # 2 x 2 h x 50 % x 2.50
    assert "killed" in top["killed"]["flags"]
    assert any("killed, lost, failed" in w for w in cb.warnings)


def test_scope_hides_other_projects_but_their_share_of_a_gpu_still_counts(ledger: Ledger) -> None:
    cb = _report(ledger, scope=frozenset({"llm"}), by=("project", "user"))
    assert [(g["project"], g["user"]) for g in cb.groups] == [("llm", "bo")]
    assert cb.groups[0]["busy_gpu_h"] == pytest.approx(1.5, abs=1e-6)  # not 1.8: zora's share is not bo's
    everything = repr(cb.as_dict())
    for hidden in ("secret", "zora", "shared-b", "solo"):
        assert hidden not in everything
    assert _report(ledger, scope=frozenset()).groups == []
    with pytest.raises(Exception, match="shared-b"):
        run_costs(ledger, ["shared-b"], scope=frozenset({"llm"}), card=CARD)


def test_rollups_give_the_same_report_as_the_intervals(ledger: Ledger, ledger_url: str) -> None:
    before = _report(ledger, by=("team", "user", "gpu_model")).as_dict()
    costs_before = run_costs(ledger, ["solo", "shared-a", "mig", "killed", "cross", "att2"], scope=None, card=CARD)
    counts = materialise_rollups(ledger)
    assert counts["runs"] == 8 and counts["skipped"] == 0
    db = Database(ledger_url)
    assert db.read(lambda c: c.scalar(sa.text("SELECT count(*) FROM gpu_rollups"))) == counts["rows"]
    db.close()
    after = _report(ledger, by=("team", "user", "gpu_model")).as_dict()
    costs_after = run_costs(ledger, ["solo", "shared-a", "mig", "killed", "cross", "att2"], scope=None, card=CARD)
    assert _close(after, before)
    assert _close(costs_after, costs_before)
    assert materialise_rollups(ledger)["runs"] == 0  # nothing left to do
    assert materialise_rollups(ledger, rebuild=True)["runs"] == 8


def _close(a, b) -> bool:  # type: ignore[no-untyped-def]
    """Equal, with money equal to the cent and hours to 1e-5: rollups re-add the same floats in
    another order, which can move a quantity by one 3.6 ms step."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) < 1e-5
    if isinstance(a, str) and isinstance(b, str) and a[:1].isdigit() and "." in a and a.replace(".", "", 1).isdigit():
        return abs(Decimal(a) - Decimal(b)) < Decimal("0.0001")
    return a == b


def test_a_running_co_tenant_holds_back_the_rollup(ledger: Ledger) -> None:
    t = _run(ledger, "live", "2026-03-11T14:30", None, status="running", team="nlp", project="llm")
    ledger.add_devices("live", [GpuIdentity(0, "GPU-shared", A100_80)])
    _intervals(ledger, "live", "GPU-shared", t, t + 600, 0.9, sm=10.0)
    counts = materialise_rollups(ledger)
    assert counts["skipped"] == 2  # shared-a and shared-b wait for "live"


def test_migration_2_adds_the_rollup_table_to_a_version_1_ledger(ledger_url: str) -> None:
    db = Database(ledger_url)
    try:
        assert mig.upgrade(db, mig.MIGRATIONS[:1]) == 1
        # Migration 1 creates today's whole schema; a ledger made by version 1 had no rollups.
        db.write(lambda c: c.execute(sa.text("DROP TABLE gpu_rollups")))
        assert mig.upgrade(db, mig.MIGRATIONS[:2]) == 2
        columns = db.read(lambda c: [col["name"] for col in sa.inspect(c).get_columns("gpu_rollups")])
    finally:
        db.close()
    # Migration 2 and schema.py agree on the table as version 2 made it (migrations 5 and 10 add the rest).
    assert columns == [c.name for c in schema.gpu_rollups.columns if c.name not in (*GROUPING_COLUMNS, "measured")]


def _back_to_version_4(db: Database) -> None:
    """Undo migration 5 on a current ledger: what version 4 made."""

    def tx(c: sa.engine.Connection) -> None:
        c.execute(sa.text("DROP INDEX ix_runs_rolled_up_started_at"))
        c.execute(sa.text("DROP INDEX ix_runs_cost_window"))
        c.execute(sa.text("ALTER TABLE runs DROP COLUMN rolled_up"))
        for name in GROUPING_COLUMNS:
            c.execute(sa.text(f'ALTER TABLE gpu_rollups DROP COLUMN "{name}"'))
        c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 5))

    db.write(tx)


def test_migration_4_adds_the_label_index_to_a_version_3_ledger(ledger_url: str) -> None:
    Ledger(ledger_url).close()
    db = Database(ledger_url)
    try:  # back to what version 3 made: no covering label index
        _back_to_version_4(db)
        db.write(lambda c: c.execute(sa.text("DROP INDEX ix_run_labels_key_run_value")))
        db.write(lambda c: c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version == 4)))
    finally:
        db.close()
    with Ledger(ledger_url) as led:
        assert led.schema_version() == mig.LATEST
    db = Database(ledger_url)
    try:
        indexes = db.read(lambda c: [ix["name"] for ix in sa.inspect(c).get_indexes("run_labels")])
    finally:
        db.close()
    assert "ix_run_labels_key_run_value" in indexes


def test_migration_5_flags_rolled_up_runs_and_copies_their_grouping_values(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        scenario(led)
        _run(led, "cpu-only", "2026-03-12T00:00", "2026-03-12T01:00")
        materialise_rollups(led)
        _run(led, "later", "2026-03-13T00:00", "2026-03-13T01:00")  # finished, not rolled up yet
        led.add_devices("later", [GpuIdentity(0, "GPU-later", A100_40)])
        _intervals(led, "later", "GPU-later", ts("2026-03-13T00:00"), ts("2026-03-13T01:00"), 0.5)
        led.update_run("later", labels={"team": "vision", "project": "det", "instance_type": "p4d.24xlarge"})
        before = _chargeback_dict(led)
    db = Database(ledger_url)
    try:
        _back_to_version_4(db)
    finally:
        db.close()
    with Ledger(ledger_url) as led:
        assert led.schema_version() == mig.LATEST
        flags = dict(led.read(lambda c: list(c.execute(sa.select(schema.runs.c.id, schema.runs.c.rolled_up)))))
        r = schema.gpu_rollups.c
        copied = led.read(lambda c: list(c.execute(sa.select(r.run_id, r.team, r.project, r.user, r.instance_type))))
        assert _chargeback_dict(led) == before  # the report reads the migrated ledger the same way
    assert flags["solo"] and flags["cpu-only"] and not flags["later"]
    assert ("shared-b", "nlp", "secret", "zora", None) in copied
    assert {row[0] for row in copied} >= {"solo", "shared-a", "shared-b"}
    assert all(row[1] is not None for row in copied)


def _back_to_version_9(db: Database) -> None:
    """Undo migration 10 on a current ledger: gpu_rollups keyed without ``measured``, each run-day's
    GPUs of one model in one row, as version 9 wrote them (busy time summed over the GPUs that had it)."""

    def tx(c: sa.engine.Connection) -> None:
        rows = [dict(r) for r in c.execute(sa.select(schema.gpu_rollups)).mappings()]
        merged: dict[tuple[object, ...], dict[str, object]] = {}
        for r in rows:
            del r["measured"]
            m = merged.setdefault((r["run_id"], r["day"], r["gpu_name"], r["mig_profile"]), {**r, "gpus": 0})
            if m is not r:
                for col in ("alloc_s", "intervals"):
                    m[col] += r[col]
                for col in ("busy_s", "energy_j"):
                    if r[col] is not None:
                        m[col] = (m[col] or 0.0) + r[col]
                m["t0"], m["t1"] = min(m["t0"], r["t0"]), max(m["t1"], r["t1"])
            m["gpus"] += r["gpus"]
        c.execute(sa.text("DROP TABLE gpu_rollups"))
        mig._add_gpu_rollups(c)
        for name in GROUPING_COLUMNS:
            c.execute(sa.text(f'ALTER TABLE gpu_rollups ADD COLUMN "{name}" TEXT'))
        old = sa.Table("gpu_rollups", sa.MetaData(), autoload_with=c)
        if merged:
            c.execute(sa.insert(old), list(merged.values()))
        c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 10))

    db.write(tx)


def test_migration_10_keys_rollups_by_measured_and_keeps_every_row(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        scenario(led)  # its MIG slice measures no busy time: a row with busy_s NULL
        t = _run(led, "mixed", "2026-03-14T00:00", "2026-03-14T04:00")
        led.add_devices("mixed", [GpuIdentity(0, "GPU-m", A100_40), GpuIdentity(1, "GPU-u", A100_40)])
        _intervals(led, "mixed", "GPU-m", t, t + 4 * H, 0.5)
        _intervals(led, "mixed", "GPU-u", t, t + 4 * H, None)  # billed its 4 held hours
        materialise_rollups(led)
        right = _chargeback_dict(led)
    db = Database(ledger_url)
    try:
        _back_to_version_9(db)
        legacy = db.read(
            lambda c: {tuple(r) for r in c.execute(sa.text("SELECT run_id, day, busy_s FROM gpu_rollups"))}
        )
    finally:
        db.close()
    with Ledger(ledger_url) as led:
        assert led.schema_version() == mig.LATEST
        r = schema.gpu_rollups.c
        rows = sa.select(r.run_id, r.day, r.busy_s, r.measured)
        kept = led.read(lambda c: list(c.execute(rows)))
        key = led.read(lambda c: sa.inspect(c).get_pk_constraint("gpu_rollups")["constrained_columns"])
        indexes = led.read(lambda c: [ix["name"] for ix in sa.inspect(c).get_indexes("gpu_rollups")])
        assert {(rid, day, busy) for rid, day, busy, _ in kept} == legacy  # every row kept as it was
        assert all(measured == (busy is not None) for _, _, busy, measured in kept)
        assert sorted(key) == sorted(["run_id", "day", "gpu_name", "mig_profile", "measured"])
        assert "ix_gpu_rollups_day" in indexes
        # The mixed run's legacy row hid GPU-u's held hours; a rebuild of the rollups writes it anew.
        assert _chargeback_dict(led) != right
        materialise_rollups(led, rebuild=True)
        assert _chargeback_dict(led) == right
        assert ("mixed", False) in {(rid, m) for rid, _, _, m in led.read(lambda c: list(c.execute(rows)))}


def _chargeback_dict(led: Ledger) -> dict[str, object]:
    lo, hi = month_window("2026-03")
    return chargeback(led, scope=None, card=CARD, start=lo, end=hi, by=("team", "project")).as_dict()


def _rolled(led: Ledger) -> dict[str, bool]:
    return dict(led.read(lambda c: list(c.execute(sa.select(schema.runs.c.id, schema.runs.c.rolled_up)))))


def _rollup_runs(led: Ledger) -> set[str]:
    return set(led.read(lambda c: list(c.scalars(sa.select(schema.gpu_rollups.c.run_id).distinct()))))


def _busy_of(report, team: str) -> float:  # type: ignore[no-untyped-def]
    return next(g["busy_gpu_h"] for g in report.groups if g["team"] == team)


def test_intervals_replayed_after_a_rollup_drop_it_and_are_billed(ledger: Ledger) -> None:
    materialise_rollups(ledger)
    assert _rolled(ledger)["solo"] and "solo" in _rollup_runs(ledger)
    before = _busy_of(_report(ledger), "vision")
    # An agent's outbox delivers two more hours of the finished run "solo" (seq 36.., 06:00-08:00).
    t = ts("2026-03-10T06:00")
    late = [GpuInterval("GPU-solo", 36 + i, t + i * 600, t + (i + 1) * 600, busy_s=600.0) for i in range(12)]
    ledger.append("solo", gpu=late)
    assert not _rolled(ledger)["solo"] and "solo" not in _rollup_runs(ledger)  # the append alone drops them
    ledger.update_run("solo", ended_at=t + 2 * H)  # and the run's end moves with what arrived
    from_intervals = _busy_of(_report(ledger), "vision")
    assert from_intervals == pytest.approx(before + 2.0, abs=1e-5)  # billed from the intervals now
    assert materialise_rollups(ledger)["runs"] == 1  # only the stale run is rolled up again
    assert _rolled(ledger)["solo"]
    assert _busy_of(_report(ledger), "vision") == pytest.approx(from_intervals, abs=1e-5)


def test_a_late_replay_drops_the_rollups_of_runs_sharing_the_gpu_that_day(ledger: Ledger) -> None:
    materialise_rollups(ledger)
    t = ts("2026-03-11T13:00")
    ledger.append("shared-a", gpu=[GpuInterval("GPU-shared", 99, t, t + 60, busy_s=60.0, proc_sm_util_avg_pct=60.0)])
    rolled = _rolled(ledger)
    assert not rolled["shared-a"] and not rolled["shared-b"]  # b's share of the GPU depends on a's
    assert rolled["solo"] and rolled["mig"]  # other GPUs: untouched
    assert {"shared-a", "shared-b"}.isdisjoint(_rollup_runs(ledger))


def test_a_changed_team_label_regroups_a_rolled_up_run(ledger: Ledger) -> None:
    materialise_rollups(ledger)
    ledger.update_run("solo", labels={"team": "ops", "project": "det"})
    assert not _rolled(ledger)["solo"]
    materialise_rollups(ledger)
    report = _report(ledger, by=("team", "project"))
    ops = next(g for g in report.groups if g["team"] == "ops")
    assert ops["runs"] == 2  # "solo" moved from vision to ops (with "cross")
    r = schema.gpu_rollups.c
    team = ledger.read(lambda c: c.scalar(sa.select(r.team).where(r.run_id == "solo").limit(1)))
    assert team == "ops"


def test_a_running_run_holds_back_only_the_runs_chained_to_it(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        early = _run(led, "early", "2026-03-01T00:00", "2026-03-01T02:00")
        live = _run(led, "live", "2026-03-02T00:00", None, status="running")
        for rid in ("early", "live"):
            led.add_devices(rid, [GpuIdentity(0, "GPU-x", A100_40)])
        _intervals(led, "early", "GPU-x", early, early + 2 * H, 0.5)
        _intervals(led, "live", "GPU-x", live, live + H, 0.5)
        counts = materialise_rollups(led)
        assert (counts["runs"], counts["skipped"]) == (1, 0)  # "early" ended a day before "live" began
        assert _rolled(led) == {"early": True, "live": False}
