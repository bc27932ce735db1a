"""A series-only run (``serve --series-only``) once its series store has dropped some of its days
past the store's own window (``retention``'s ``series.days_dropped``, store/series_window.py), on
the compact PostgreSQL store and chDB: ``audit verify --series`` names those days expired, not
missing, and still checks the days the store keeps against the run's seal (per day) and its day
sums; a kept row changed, a day sum changed or a day gone without a recorded drop is TAMPERED.
``show``, ``report run`` and ``cost`` keep the figures of the day sums and say the curves expired.
"""

from __future__ import annotations

import json
import time
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.core.pricing.usage import DAY_S
from gpuledger.store import Ledger, schema, series_segments, series_tier, series_verify
from server_support import setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY
from test_series_live import HALF, _pushes
from test_series_only import _post, _server, _tamper

pytestmark = pytest.mark.postgres
pg_url, series_url = tiers.pg_url, tiers.series_url

FIRST, SECOND = (time.strftime("%Y-%m-%d", time.gmtime(d * DAY_S)) for d in (TODAY - 11, TODAY - 10))


def _sealed(pg_url: str, series_url: str, tmp_path: Path) -> tuple[str, list[str]]:
    """A finished series-only run across the midnight between FIRST and SECOND: (its id, its GPUs)."""
    tokens = setup_accounts(pg_url)
    whole, first, final = _pushes()
    with _server(pg_url, series_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, first).status_code == 200
        got = _post(server, tokens.agent_a, final)
        assert got.status_code == 200 and got.json()["sealed"], got.text
    run_id = whole["run"]["id"]
    with Ledger(pg_url) as led:
        seal = led.read(lambda conn: series_segments.latest_seal(conn, run_id))
    assert seal is not None and sorted(seal["days"]["host"]) == [FIRST, SECOND]  # per-day summaries
    return run_id, sorted({r["device_uuid"] for r in whole["gpu_intervals"]})


def _drop_first_day(pg_url: str, series_url: str) -> None:
    """Retention keeps the store's window: a window of 11 days drops FIRST, recorded."""
    assert tiers.expire_store_days(pg_url, series_url, 11, time.time()) >= 1


def _check(pg_url: str, series_url: str) -> series_verify.SeriesCheck:
    store = series_tier.open_store(series_url, create=False)
    try:
        with Ledger(pg_url) as led:
            return series_verify.check(led, store, series_url)
    finally:
        store.close()


def _change_day_sum(pg_url: str, run_id: str, gpu: str, **values: Any) -> None:
    """Change the ledger's day sums of ``gpu`` on the kept day (TODAY - 10), as a tamperer would."""
    d = schema.series_day_sums.c
    where = (d.run_id == run_id, d.device_uuid == gpu, d.day == TODAY - 10)
    with Ledger(pg_url) as led:
        led.write(lambda conn: conn.execute(sa.update(schema.series_day_sums).where(*where).values(**values)))


def _verify(pg_url: str, series_url: str, tmp_path: Path) -> Any:
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS)}
    return CliRunner().invoke(cli, ["audit", "verify", "--db", pg_url, "--series", series_url], env=env)


def test_days_the_store_dropped_are_expired_and_a_changed_kept_row_is_tampered(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, gpus = _sealed(pg_url, series_url, tmp_path)
    _drop_first_day(pg_url, series_url)
    ok = _verify(pg_url, series_url, tmp_path)
    assert ok.exit_code == 0, ok.output
    assert "1 series-only runs checked" in ok.output and "TAMPERED" not in ok.output
    assert f"series-only run days ({FIRST}) expired from the series store by retention on" in ok.output
    found = _check(pg_url, series_url)
    assert found.problems == [] and found.run_days_expired == 1 and found.runs_checked == 1
    store = series_tier.open_store(series_url, create=False)
    try:
        _tamper(series_url, store, HALF + 3)  # a row of each GPU on SECOND, the day the store keeps
    finally:
        store.close()
    found = _check(pg_url, series_url)
    assert found.problems == [
        f"run {run_id} GPU {gpu} seq {HALF}-{HALF * 2 - 1} ({SECOND}): sums of energy_mj differ from those sealed "
        "(sealed series-only run)"
        for gpu in gpus
    ]
    bad = _verify(pg_url, series_url, tmp_path)
    assert bad.exit_code == 1 and bad.output.count("TAMPERED") == 2, bad.output


def test_a_day_gone_without_a_recorded_drop_is_missing(pg_url: str, series_url: str, tmp_path: Path) -> None:
    run_id, gpus = _sealed(pg_url, series_url, tmp_path)
    _drop_first_day(pg_url, series_url)
    store = series_tier.open_store(series_url, create=False)
    try:
        # SECOND dropped behind the ledger's back: no series.days_dropped entry says so
        assert store.drop_days_before(date.fromisoformat(SECOND) + timedelta(days=1)) >= 1
    finally:
        store.close()
    problems = _check(pg_url, series_url).problems
    missing = [p for p in problems if "missing from the series store" in p]
    assert len(missing) == 3 and all(f"({SECOND})" in p for p in missing), problems  # both GPUs and the host
    assert f"run {run_id} host seq {HALF}-{HALF * 2 - 1} ({SECOND}): missing" in " ".join(missing)
    assert sum("the store holds no row of the day" in p for p in problems) == len(gpus)  # the day sums too
    bad = _verify(pg_url, series_url, tmp_path)
    assert bad.exit_code == 1 and "missing from the series store" in bad.output, bad.output


def test_a_changed_day_sum_of_a_kept_day_is_tampered(pg_url: str, series_url: str, tmp_path: Path) -> None:
    """The day sums are what cost and the run lists read: checked against the store's rows."""
    run_id, gpus = _sealed(pg_url, series_url, tmp_path)
    _drop_first_day(pg_url, series_url)
    _change_day_sum(pg_url, run_id, gpus[0], busy_s=schema.series_day_sums.c.busy_s + 60.0)
    (problem,) = _check(pg_url, series_url).problems
    assert problem.startswith(f"run {run_id} GPU {gpus[0]} ({SECOND}): the ledger's day sums differ")
    assert "busy_s" in problem


def _cli(pg_url: str, tmp_path: Path, series_url: str, *args: str) -> Any:
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series_url}
    out = CliRunner().invoke(cli, [*args, "--db", pg_url], env=env)
    assert out.exit_code == 0, out.output
    return out


def test_show_report_and_cost_keep_the_day_sums_figures_and_say_the_curves_expired(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, _ = _sealed(pg_url, series_url, tmp_path)
    shown = json.loads(_cli(pg_url, tmp_path, series_url, "show", run_id, "--json").stdout)
    report = json.loads(_cli(pg_url, tmp_path, series_url, "report", "run", run_id, "--format", "json").stdout)
    cost = json.loads(_cli(pg_url, tmp_path, series_url, "cost", run_id, "--format", "json").stdout)
    assert "series_expired" not in shown and "series_expired" not in report["run"]
    _drop_first_day(pg_url, series_url)
    after = json.loads(_cli(pg_url, tmp_path, series_url, "show", run_id, "--json").stdout)
    assert after["series_expired"]["days"] == [FIRST]
    # every day's, not SECOND's only; the store keeps ms and mJ, the day sums what was pushed
    for column in ("busy_seconds", "energy_joules"):
        assert [g[column] for g in after["gpus"]] == pytest.approx([g[column] for g in shown["gpus"]], abs=0.05)
    assert after["busy_gpu_hours"] == pytest.approx(shown["busy_gpu_hours"], rel=1e-2)
    assert after["intervals"] == shown["intervals"]
    text = _cli(pg_url, tmp_path, series_url, "show", run_id).stdout
    assert f"raw curves of 1 day ({FIRST}) expired from the series store" in text
    rerun = json.loads(_cli(pg_url, tmp_path, series_url, "report", "run", run_id, "--format", "json").stdout)
    assert rerun["run"]["series_expired"]["days"] == [FIRST]
    assert [g["busy_seconds"] for g in rerun["run"]["gpus"]] == pytest.approx(
        [g["busy_seconds"] for g in report["run"]["gpus"]], abs=0.05
    )
    md = _cli(pg_url, tmp_path, series_url, "report", "run", run_id, "--format", "md").stdout
    assert "expired from the series store" in md
    out = tmp_path / "report.html"
    _cli(pg_url, tmp_path, series_url, "report", "run", run_id, "--format", "html", "-o", str(out))
    assert f'<div class="banner">raw curves of 1 day ({FIRST}) expired' in out.read_text()
    again = json.loads(_cli(pg_url, tmp_path, series_url, "cost", run_id, "--format", "json").stdout)
    cents = [Decimal(c["runs"][0]["total"]["cost"]).quantize(Decimal("0.01")) for c in (cost, again)]
    assert cents[0] == cents[1] > 0  # from the day sums, every day (not the rows of SECOND only)


def test_a_seal_without_per_day_summaries_checks_the_kept_days_against_the_day_sums(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """A run sealed before the seal kept per-day summaries: its kept days are checked against its
    day sums only, and the output says so."""
    run_id, gpus = _sealed(pg_url, series_url, tmp_path)
    with Ledger(pg_url) as led:

        def older(conn: sa.Connection) -> None:
            seal = series_segments.latest_seal(conn, run_id)
            assert seal is not None
            series_segments.seal(conn, run_id, {k: v for k, v in seal.items() if k != "days"}, actor="test")

        led.write(older)
    _drop_first_day(pg_url, series_url)
    found = _check(pg_url, series_url)
    assert found.problems == [] and found.run_days_expired == 1
    assert any("sealed before the seal kept per-day summaries" in n for n in found.notes), found.notes
    _change_day_sum(pg_url, run_id, gpus[1], energy_j=schema.series_day_sums.c.energy_j - 1.0)
    (problem,) = _check(pg_url, series_url).problems
    assert f"GPU {gpus[1]} ({SECOND}): the ledger's day sums differ" in problem and "energy_j" in problem
