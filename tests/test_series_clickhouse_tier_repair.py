"""A ClickHouse write killed between its raw part and its rollup views' parts (issue 38), when
retention tiers a day (``retention run --series``) or ``db migrate --layout compact`` moves a run:
the rerun finds the rows held, leaves them out, and makes their rollups whole
(store/series_live.lacking -> series/clickhouse_repair.py), so chargeback, which reads the rollups,
is not short for good. A tiered day whose rollups are short anyway is named by the tier check and
by ``audit verify --series``.

The kill is made on chDB deterministically, as tests/test_series_clickhouse_view_repair.py makes
it: the views detached while the killed write inserts its rows (the raw part committed, no view
part), attached again, then the process "dies" (raises). What a user would notice: the run's raw
rows, its GPU × day rollups, its run × day rollups and ``monthly_chargeback`` equal those of the
same rows written without a kill (a control run beside it).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ci_support import need_module

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

import test_series_tier as tiers  # noqa: E402
from gpuledger.cli.main import cli  # noqa: E402
from gpuledger.series.clickhouse import ClickHouseSeries  # noqa: E402
from gpuledger.store import Ledger, series_compact, series_live, series_tier, series_verify  # noqa: E402
from gpuledger.store.retention import DAY_S, _tampered  # noqa: E402
from test_pg_partitions import OPEN_DAYS, TODAY  # noqa: E402
from test_series_clickhouse_view_repair import BOTH, _killed  # noqa: E402

pytestmark = pytest.mark.postgres
pg_url = tiers.pg_url
N = tiers.N
FIRST, SECOND = tiers._date(TODAY - 11), tiers._date(TODAY - 10)  # the runs cross the midnight between


RUN_DAYS = ("run_day_rollups_mv",)  # killed between the two views: GPU day rollups written, run x day not
KILLS = [pytest.param(BOTH, id="before-both-views"), pytest.param(RUN_DAYS, id="between-the-views")]


class KilledBeforeViews:
    """The real store, but the write with ``token`` stores its raw rows and not the parts of
    ``views``, and then the process dies (raises): a kill between the raw and the views' parts."""

    def __init__(self, store: ClickHouseSeries, token: str, views: tuple[str, ...] = BOTH, die: bool = True) -> None:
        self.store = store
        self.token = token
        self.views = views
        self.die = die
        self.killed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write(self, run_id: str, gpu: Any, host: Any, token: str) -> int:
        if token != self.token:
            return self.store.write(run_id, gpu, host, token)
        with _killed(self.store, *self.views):
            stored = self.store.write(run_id, gpu, host, token)
        self.killed += 1
        if self.die:
            raise RuntimeError("killed between the raw part and the views' parts")
        return stored


@pytest.fixture
def series(tmp_path: Path) -> Iterator[str]:
    yield f"chdb://{tmp_path}/series"


def _two_runs(pg_url: str) -> tuple[str, str]:
    """The victim and a control: the same rows (2 GPUs, across a midnight ten days ago), two runs."""
    control = tiers._body((TODAY - 10) * DAY_S - N / 2 * 5.0)
    victim, _, _ = tiers._ingested(pg_url, 2, control)
    return victim, control["run"]["id"]


def _state(store: ClickHouseSeries, run_id: str) -> dict[str, Any]:
    """What a user reads of a run in the store: raw rows, GPU × day rollups, run × day rollups."""
    lo, hi = (TODAY - 12) * DAY_S, TODAY * DAY_S
    days = [
        {k: v for k, v in vars(r).items() if k != "run_id"} for r in store.day_rollups(lo, hi) if r.run_id == run_id
    ]
    run_days = store.client.query(
        f"SELECT toString(day), sum(allocated_ms), sum(busy_ms), sum(energy_mj) FROM "
        f"{store.layout.table('run_day_rollups')} WHERE run = {{r:UInt64}} GROUP BY day ORDER BY day",
        {"r": store._key("run", run_id)},
    )
    return {
        "raw": store.gpu_intervals(run_id),
        "days": sorted(days, key=lambda d: (d["day"], d["device_uuid"])),
        "run_days": [[d, *(int(x) for x in v)] for d, *v in run_days],
    }


def _chargeback(store: ClickHouseSeries, victim: str, control: str) -> dict[str, list[tuple[Any, ...]]]:
    """``monthly_chargeback`` per team, the victim and the control each a team of its own."""
    store.put_runs([(victim, "victim", "p", "u"), (control, "control", "p", "u")], 1)
    months = store.monthly_chargeback(datetime.date.fromisoformat(FIRST), datetime.date.fromisoformat(SECOND))
    return {team: [m[3:] for m in months if m[0] == team] for team in ("victim", "control")}


@pytest.mark.parametrize("views", KILLS)
@pytest.mark.parametrize("day", [FIRST, SECOND])
def test_a_tiering_killed_before_the_views_is_made_whole_by_the_rerun(
    pg_url: str, series: str, day: str, views: tuple[str, ...]
) -> None:
    victim, control = _two_runs(pg_url)
    tier = series_tier.Tier.open(series)
    store = tier.store
    assert isinstance(store, ClickHouseSeries)
    try:
        with Ledger(pg_url) as led:
            killing = KilledBeforeViews(store, f"tier:{day}:{victim}", views)
            with pytest.raises(RuntimeError, match="killed between"):
                tiers._retention(led, series_tier.Tier(killing, tier.url))  # type: ignore[arg-type]
            assert killing.killed == 1
            # The killed day's raw rows are in the store, its rollups are not: chargeback is short.
            gpu = [r for r in tiers._rows(led.gpu_intervals(victim)) if tiers._date(int(r["t0"] // DAY_S)) == day]
            assert store.held(victim, gpu, [])[0] == {(r["device_uuid"], r["seq"]) for r in gpu}
            assert day not in [d for d, *_ in _state(store, victim)["run_days"]]  # chargeback would miss it
            report = tiers._retention(led, tier)  # the rerun: `retention run --series`
            assert report.days is not None, report
            assert report.days.dropped == ([FIRST, SECOND] if day == FIRST else [SECOND]), report.days
            assert store.rollups_repaired > 0
            assert len(list(led.read(lambda c: list(series_verify.tiered(c))))) == 4  # 2 runs x 2 days
        whole = _state(store, control)
        assert len(whole["raw"]) == 2 * N and len(whole["days"]) == 4  # 2 GPUs x 2 days
        assert _state(store, victim) == whole
        charged = _chargeback(store, victim, control)
        assert charged["victim"] == charged["control"] and charged["victim"], charged
        assert not series_tier.rollup_differences(
            store, victim, {"gpu": {g["device_uuid"]: 0 for g in whole["days"]}}, day
        )
    finally:
        store.close()


def _compact_batch(pg_url: str, run: str) -> tuple[list[dict[str, Any]], str]:
    """``run``'s GPU rows as the compact migration's one batch of them, and its token (the write to kill)."""
    with Ledger(pg_url) as led:
        gpu = [{c: getattr(g, c) for c in series_tier.GPU_COLUMNS} for g in led.gpu_intervals(run)]
    gpu.sort(key=lambda r: (r["device_uuid"], r["seq"]))
    return gpu, "compact:" + series_live.batch_token(run, gpu, [])


def _compact_setup(
    pg_url: str, series: str
) -> tuple[str, str, list[dict[str, Any]], str, series_tier.Tier, ClickHouseSeries]:
    """The two runs, the victim's compact batch and its token, and the tier on the ClickHouse store."""
    victim, control = _two_runs(pg_url)
    gpu, token = _compact_batch(pg_url, victim)
    tier = series_tier.Tier.open(series)
    assert isinstance(tier.store, ClickHouseSeries)
    return victim, control, gpu, token, tier, tier.store


@pytest.mark.parametrize("views", KILLS)
def test_a_compact_migration_killed_before_the_views_is_made_whole_by_the_next_call(
    pg_url: str, series: str, tmp_path: Path, views: tuple[str, ...]
) -> None:
    victim, control, gpu, token, tier, store = _compact_setup(pg_url, series)
    try:
        with Ledger(pg_url) as led:
            killing = KilledBeforeViews(store, token, views)
            with pytest.raises(RuntimeError, match="killed between"):
                series_compact.compact(led, series_tier.Tier(killing, tier.url), actor="test", tampered=_tampered)  # type: ignore[arg-type]
            assert killing.killed == 1
            # Its raw rows are in the store, without their run x day rollups: chargeback would miss
            # the run (and without the GPU rollups the reads, which find a run's days through them).
            assert store.held(victim, gpu, [])[0] == {(r["device_uuid"], r["seq"]) for r in gpu}
            assert _state(store, victim)["run_days"] == []
    finally:
        store.close()
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series,
           "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}  # fmt: skip
    out = CliRunner().invoke(cli, ["db", "migrate", "--db", pg_url, "--layout", "compact", "--series", series], env=env)
    assert out.exit_code == 0, out.output
    store = series_tier.open_store(series, create=False)
    assert isinstance(store, ClickHouseSeries)
    try:
        whole = _state(store, control)
        assert len(whole["raw"]) == 2 * N and len(whole["days"]) == 4
        assert _state(store, victim) == whole
        charged = _chargeback(store, victim, control)
        assert charged["victim"] == charged["control"] and charged["victim"], charged
    finally:
        store.close()
    with Ledger(pg_url) as led:
        assert led.gpu_intervals(victim) == [] and led.gpu_intervals(control) == []  # both moved


def test_a_compact_run_whose_rollups_are_short_is_not_moved_until_a_call_repairs_them(pg_url: str, series: str) -> None:
    """A migration write killed between the two views, the process going on: every raw row reads
    back, but chargeback's run × day rollup is missing; the run is not moved (named), and the next
    call repairs the rollups and moves it."""
    victim, control, _, token, tier, store = _compact_setup(pg_url, series)
    try:
        with Ledger(pg_url) as led:
            killing = KilledBeforeViews(store, token, RUN_DAYS, die=False)
            report = series_compact.compact(led, series_tier.Tier(killing, tier.url), actor="test", tampered=_tampered)  # type: ignore[arg-type]
            assert killing.killed == 1
            assert victim in report.failed and "run × day rollup (chargeback)" in report.failed[victim], report.failed
            assert led.gpu_intervals(victim) != [] and led.gpu_intervals(control) == []
            series_compact.compact(led, tier, actor="test", tampered=_tampered)
            assert led.gpu_intervals(victim) == []
        charged = _chargeback(store, victim, control)
        assert charged["victim"] == charged["control"] and charged["victim"], charged
    finally:
        store.close()


def test_a_day_whose_rollups_are_short_is_kept_in_postgresql_until_a_rerun_repairs_it(pg_url: str, series: str) -> None:
    """A write killed between the two views, the process going on: every raw row reads back, but
    chargeback's run × day rollup is missing; the tier check names it and the day stays."""
    victim, control = _two_runs(pg_url)
    tier = series_tier.Tier.open(series)
    store = tier.store
    assert isinstance(store, ClickHouseSeries)
    try:
        with Ledger(pg_url) as led:
            killing = KilledBeforeViews(store, f"tier:{SECOND}:{victim}", RUN_DAYS, die=False)
            report = tiers._retention(led, series_tier.Tier(killing, tier.url))  # type: ignore[arg-type]
            assert killing.killed == 1 and report.days is not None
            assert report.days.dropped == [FIRST] and list(report.days.kept) == [SECOND], report.days
            why = report.days.kept[SECOND]
            assert f"run {victim} run × day rollup (chargeback) of {SECOND} short of its raw rows: " in why, why
            assert "busy_ms 0 of " in why, why
            assert len(led.gpu_intervals(victim)) == N  # the day stays in PostgreSQL
            report = tiers._retention(led, tier)
            assert report.days is not None and report.days.dropped == [SECOND], report.days
        assert _state(store, victim) == _state(store, control)
    finally:
        store.close()


def test_audit_verify_series_names_a_tiered_day_whose_rollups_are_short(
    pg_url: str, series: str, tmp_path: Path
) -> None:
    victim, control = _two_runs(pg_url)
    tier = series_tier.Tier.open(series)
    store = tier.store
    assert isinstance(store, ClickHouseSeries)
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}
    args = ["audit", "verify", "--db", pg_url, "--series", series]
    try:
        with Ledger(pg_url) as led:
            report = tiers._retention(led, tier)
            assert report.days is not None and report.days.dropped == [FIRST, SECOND], report.days
        ok = CliRunner().invoke(cli, args, env=env)
        assert ok.exit_code == 0 and "4 tiered run days checked" in ok.output, ok.output
        # The victim's rollups lose half their busy time (as a lost view part would), raw rows intact.
        device = _state(store, victim)["days"][0]["device_uuid"]
        run = store._key("run", victim)
        for table, where in (("run_day_rollups", f"day = '{FIRST}'"), ("gpu_day_rollups", f"day = '{SECOND}'")):
            if table == "gpu_day_rollups":
                where += f" AND gpu = {store._key('gpu', device)}"
            store.client.command(
                f"ALTER TABLE {store.layout.local(table)} UPDATE busy_ms = intDiv(busy_ms, 2) "
                f"WHERE run = {run} AND {where}",
                {"mutations_sync": 2},
            )
    finally:
        store.close()
    bad = CliRunner().invoke(cli, args, env=env)
    assert bad.exit_code == 1, bad.output
    assert f"run {victim} run × day rollup (chargeback) of {FIRST} short of its raw rows: busy_ms " in bad.output
    assert f"run {victim} GPU {device} day rollup of {SECOND} short of its raw rows: busy_ms " in bad.output
    assert control not in bad.output and bad.output.count("short of its raw rows") == 2, bad.output
