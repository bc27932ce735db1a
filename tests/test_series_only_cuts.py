"""A price change inside a day for a series-only run (store/series_cut_days.py): the same pushes
as a plain run and as a series-only run (``serve --series-only``, compact PostgreSQL store and
chDB), a rate card whose price changes at 14:00 inside the run's day: ``cost RUN``,
``report chargeback --month`` (before and after the runs are rolled up) and its FOCUS rows give
both runs the same money to the cent. Once the store has dropped the day past its window, the
series-only run's day is priced whole, as before, and the output says so."""

from __future__ import annotations

import copy
import csv
import io
import json
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.core.ids import short_id
from gpuledger.core.pricing.usage import DAY_S
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.reports.cost.usage import _add_raw
from gpuledger.store import Ledger, series_cut_days, series_day_sums
from server_support import setup_accounts
from test_pg_partitions import TODAY
from test_series_only import _post, _server

pytestmark = pytest.mark.postgres
pg_url, series_url = tiers.pg_url, tiers.series_url

DAY = TODAY - 10
CUT = DAY * DAY_S + 14 * 3600  # 14:00 UTC
START = CUT - tiers.N / 2 * 5.0  # the run: 13:57:30 to 14:02:30, half of it after the change
MONTH = time.strftime("%Y-%m", time.gmtime(CUT))


def _rates(tmp_path: Path) -> str:
    """A card whose A100 price rises tenfold at 14:00 inside the run's day (busy basis)."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(CUT))
    path = tmp_path / "rates.toml"
    path.write_text(
        '[card]\nname = "cut"\ncurrency = "USD"\nbasis = "busy"\n\n'
        f'[[gpu]]\nmodel = "A100-80GB-SXM"\nprice_per_hour = "3.00"\neffective_to = {at}\n\n'
        f'[[gpu]]\nmodel = "A100-80GB-SXM"\nprice_per_hour = "30.00"\neffective_from = {at}\n'
    )
    return str(path)


def _pair(pg_url: str, series_url: str, tmp_path: Path) -> tuple[str, str]:
    """The same pushes as a plain run (GPUs renamed, a new run id) and as a series-only run."""
    tokens = setup_accounts(pg_url)
    whole = tiers._body(START)
    for r in whole["gpu_intervals"]:  # busier after the change: held time alone would not split it right
        r["busy_s"] += 2.0 if r["t0"] >= CUT else -2.0
    plain = copy.deepcopy(whole)
    plain["run"]["id"] = str(uuid.uuid4())
    for d in plain["devices"]:
        d["uuid"] += "-plain"
    for r in plain["gpu_intervals"]:
        r["device_uuid"] += "-plain"
    with _server(pg_url, None, tmp_path) as server:
        assert _post(server, tokens.agent_a, plain).status_code == 200
    with _server(pg_url, series_url, tmp_path) as server:
        got = _post(server, tokens.agent_a, whole)
        assert got.status_code == 200, got.text
    return plain["run"]["id"], whole["run"]["id"]


def _cli(pg_url: str, tmp_path: Path, rates: str, series: str | None, *args: str) -> Any:
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series or "", "GPULEDGER_RATES": rates}
    out = CliRunner().invoke(cli, [*args, "--db", pg_url], env=env)
    assert out.exit_code == 0, out.output
    return out


def _run_costs(pg_url: str, tmp_path: Path, rates: str, series: str | None, *ids: str) -> dict[str, Any]:
    out = _cli(pg_url, tmp_path, rates, series, "cost", *ids, "--format", "json")
    report = json.loads(out.stdout)
    return {r["run_id"]: _cents(r["total"]["cost"]) for r in report["runs"]} | {"notes": report["notes"]}


def _chargeback(pg_url: str, tmp_path: Path, rates: str, series: str | None) -> tuple[dict[str, Decimal], list[str]]:
    out = _cli(pg_url, tmp_path, rates, series, "report", "chargeback", "--month", MONTH, "--format", "json")
    report = json.loads(out.stdout)
    return {r["run_id"]: _cents(r["cost"]) for r in report["top_runs_by_cost"]}, report["warnings"]


def _focus(pg_url: str, tmp_path: Path, rates: str, series: str | None) -> dict[str, Decimal]:
    out = _cli(pg_url, tmp_path, rates, series, "report", "chargeback", "--month", MONTH, "--format", "focus")
    per_run: dict[str, Decimal] = {}
    for row in csv.DictReader(io.StringIO(out.stdout)):
        per_run[row["ResourceId"]] = per_run.get(row["ResourceId"], Decimal(0)) + Decimal(row["BilledCost"])
    return {run_id: _cents(cost) for run_id, cost in per_run.items()}


def _cents(amount: Any) -> Decimal:
    """To the cent: the store keeps busy time in ms, so a series-only run's exact amount differs
    from the plain run's in the fourth decimal place."""
    return Decimal(str(amount)).quantize(Decimal("0.01"))


def test_a_price_change_inside_a_day_splits_a_series_only_run_as_a_plain_one(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    plain, only = _pair(pg_url, series_url, tmp_path)
    rates = _rates(tmp_path)
    costs = _run_costs(pg_url, tmp_path, rates, series_url, plain, only)
    assert costs[only] == costs[plain] > 0 and costs["notes"] == []
    for rolled in (False, True):  # the runs read from their day sums, then from their rollups
        if rolled:
            with Ledger(pg_url) as led:
                materialise_rollups(led)
        bill, warnings = _chargeback(pg_url, tmp_path, rates, series_url)
        assert bill[only] == bill[plain] == costs[plain], (rolled, bill)
        assert not [w for w in warnings if "price changes within the day" in w]
        focus = _focus(pg_url, tmp_path, rates, series_url)
        assert focus[only] == focus[plain] == costs[plain], focus
    # Without the store the day cannot be split: priced whole at the price of its middle (12:00,
    # the old price), and said so.
    bill, warnings = _chargeback(pg_url, tmp_path, rates, None)
    assert bill[only] != bill[plain]
    (note,) = [w for w in warnings if "price changes within the day" in w]
    assert short_id(only) in note and "no series store was given" in note


def test_a_day_the_store_dropped_is_priced_whole_and_said_so(pg_url: str, series_url: str, tmp_path: Path) -> None:
    plain, only = _pair(pg_url, series_url, tmp_path)
    rates = _rates(tmp_path)
    before = _run_costs(pg_url, tmp_path, rates, series_url, plain, only)
    unsplit = _run_costs(pg_url, tmp_path, rates, None, only)  # priced as before this change: whole
    assert unsplit[only] < before[only] == before[plain]
    assert tiers.expire_store_days(pg_url, series_url, 5, time.time()) > 0  # the run's day dropped
    costs = _run_costs(pg_url, tmp_path, rates, series_url, only)
    assert costs[only] == unsplit[only]  # from its day sums, not from the few rows left (none)
    (note,) = costs["notes"]
    assert short_id(only) in note and "no longer holds all of its intervals" in note
    day = time.strftime("%Y-%m-%d", time.gmtime(CUT))
    assert day in note
    out = _cli(pg_url, tmp_path, rates, series_url, "cost", only)
    assert "priced whole at the price in force at its middle" in out.stdout
    bill, warnings = _chargeback(pg_url, tmp_path, rates, series_url)
    assert bill[only] == unsplit[only] and any(short_id(only) in w for w in warnings)


# -- the split itself, without a store -------------------------------------------------------------


@st.composite
def _rows(draw: Any) -> tuple[list[dict[str, Any]], list[float]]:
    """One GPU's intervals one after another over about three days (some crossing a midnight,
    some not measured) and price changes inside the days."""
    t, rows = draw(st.floats(0, DAY_S)), []
    for seq in range(draw(st.integers(1, 12))):
        t0 = t + draw(st.sampled_from([0.0, 0.0, 7.5]))
        t1 = t0 + draw(st.sampled_from([5.0, 600.0, 3 * 3600.0, 20 * 3600.0]))
        busy = draw(st.none() | st.floats(0, 1))
        rows.append({"device_uuid": "GPU-0", "seq": seq, "t0": t0, "t1": t1,
                     "busy_s": None if busy is None else busy * (t1 - t0), "energy_j": 100.0 * (t1 - t0)})  # fmt: skip
        t = t1
    cuts = sorted(draw(st.sets(st.floats(1.0, 4 * DAY_S - 1.0).filter(lambda c: c % DAY_S), max_size=3)))
    return rows, cuts


_SLIVER = 86399.99999999999  # one float step before the first midnight: (t0 + 86400) / 2 rounds onto it


@settings(max_examples=200, deadline=None)
@given(_rows())
@example(([{"device_uuid": "GPU-0", "seq": 0, "t0": _SLIVER, "t1": _SLIVER + 5.0, "busy_s": None, "energy_j": 500.0}],
          [86401.0]))  # fmt: skip
def test_day_sums_with_the_cut_days_read_raw_price_as_the_raw_rows(
    drawn: tuple[list[dict[str, Any]], list[float]],
) -> None:
    """Each day with a cut replaced by its rows clipped to it (``day_parts``), the others kept as
    day sums: per price period the same busy time, energy and rows as every row cut raw."""
    rows, cuts = drawn
    columns = ("device_uuid", "t0", "t1", *series_day_sums.SUMMED)
    sums = series_day_sums.day_rows("r", [[r[c] for c in columns] for r in rows], columns)
    cut_days = {int(c // DAY_S) for c in cuts}
    want: dict[Any, dict[str, Any]] = {}
    for r in rows:
        _add_raw(want, r, cuts)
    got: dict[Any, dict[str, Any]] = {}
    for s in sums:
        if s["day"] not in cut_days:
            got[(s["day"], sum(c < (s["day"] + 0.5) * DAY_S for c in cuts))] = dict(s)
    for day in sorted({s["day"] for s in sums} & cut_days):
        touching = [r for r in rows if r["t1"] > day * DAY_S and r["t0"] < (day + 1) * DAY_S]
        parts = series_cut_days.day_parts("r", day, [s for s in sums if s["day"] == day], touching)
        assert parts is not None
        for p in parts:
            _add_raw(got, p, cuts)
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        assert (g["intervals"], g["busy_n"] > 0, g["energy_n"] > 0) == (
            w["intervals"],
            w["busy_n"] > 0,
            w["energy_n"] > 0,
        )
        for col in ("busy_s", "energy_j"):
            assert (g[col] is None) == (w[col] is None)
            if w[col] is not None:
                assert g[col] == pytest.approx(w[col], rel=1e-9, abs=1e-6)


def test_a_day_whose_rows_the_store_lacks_is_not_split() -> None:
    rows = [
        {"device_uuid": "GPU-0", "t0": DAY * DAY_S - 10.0, "t1": DAY * DAY_S + 10.0, "busy_s": 1.0, "energy_j": 2.0}
    ]
    columns = ("device_uuid", "t0", "t1", *series_day_sums.SUMMED)
    sums = [
        s for s in series_day_sums.day_rows("r", [[r[c] for c in columns] for r in rows], columns) if s["day"] == DAY
    ]
    assert series_cut_days.day_parts("r", DAY, sums, rows) is not None
    assert series_cut_days.day_parts("r", DAY, sums, []) is None  # the row's first day dropped with it
