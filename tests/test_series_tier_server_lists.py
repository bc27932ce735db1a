"""The team server's run list (``GET /api/v1/runs``, the dashboard's runs page and its running
runs) of a run whose raw days were tiered into a series store and dropped from PostgreSQL
(store/series_tier.py): a real ``gpuledger serve --series`` gives the run's GPUs and busy
GPU-hours that ``gpuledger runs`` gives with the store, and that both gave before the drop, from
the audit trail's sums (store/tiered_totals.py), not the store; without the store, the days are
gone, as the CLI reads them; a run nothing measured stays None (n/a), never 0. On the real
PostgreSQL server, into the compact PostgreSQL store and ClickHouse on chDB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.store import Ledger, accounts, server_queries
from server_support import ServerProcess, bearer
from test_series_tier_reads import SLACK, _drop, _half_dropped, _unmeasured
from test_series_tier_server import _other_run

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
UNMEASURED = "0b5e55ed-0000-4000-8000-000000000002"
GPUS = ("GPU-0", "GPU-1")
DAY_S = 86400.0


def _cli_rows(pg_url: str, tmp_path: Path, series: str | None) -> dict[str, tuple[int, float | None]]:
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series or ""}
    out = CliRunner().invoke(cli, ["runs", "--json", "--db", pg_url], env=env)
    assert out.exit_code == 0, out.output
    return {r["id"]: (r["gpus"], r["busy_gpu_hours"]) for r in json.loads(out.output)}


def _served_rows(pg_url: str, tmp_path: Path, series: str | None) -> dict[str, tuple[int, float | None]]:
    """The run list of a real ``gpuledger serve`` (with ``--series`` through its environment)."""
    with Ledger(pg_url) as led:
        token = accounts.issue_token(led, "lister", role="admin", actor="test", create_user=True)[1]
    env = {"GPULEDGER_SERIES": series or "", "GPULEDGER_CLOSE_AFTER_DAYS": str(tiers.OPEN_DAYS)}
    with ServerProcess(pg_url, log=tmp_path / "serve.log", env=env) as server:
        got = httpx.get(f"{server.url}/api/v1/runs", params={"limit": 100}, headers=bearer(token), timeout=30)
        assert got.status_code == 200, got.text
        for row in got.json():  # one run as the dashboard's run page reads it: show --json's figures
            one = httpx.get(f"{server.url}/api/v1/runs/{row['id']}", headers=bearer(token), timeout=30)
            assert one.status_code == 200, one.text
            SHOWN[(series, row["id"])] = _shown(one.json())
    return {r["id"]: (r["gpus"], r["busy_gpu_hours"]) for r in got.json()}


SHOWN: dict[tuple[str | None, str], tuple[Any, ...]] = {}  # (store, run id) -> _shown of /runs/{id}


def _shown(show: dict[str, Any]) -> tuple[Any, ...]:
    return (show["intervals"], show["busy_gpu_hours"], *(g["intervals"] for g in show["gpus"]))


def _cli_show(pg_url: str, tmp_path: Path, run_id: str, series: str | None) -> tuple[Any, ...]:
    env = {"GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series or ""}
    out = CliRunner().invoke(cli, ["show", run_id, "--json", "--db", pg_url], env=env)
    assert out.exit_code == 0, out.output
    return _shown(json.loads(out.output))


def _same(a: float | None, b: float | None) -> bool:
    """The same figure: both None, or equal but for the order of a float sum."""
    return a is None if b is None else a is not None and a == pytest.approx(b, rel=1e-12)


def _close(a: tuple[int, float | None], b: tuple[int, float | None]) -> bool:
    """The same GPUs, and busy hours both None or within the store's quantizing slack."""
    if a[0] != b[0] or (a[1] is None) != (b[1] is None):
        return False
    return a[1] is None or b[1] is None or abs(a[1] - b[1]) <= SLACK / 3600


def test_the_server_run_list_counts_a_tiered_runs_dropped_days_as_the_cli_does(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    run_id, _, _ = tiers._ingested(pg_url, 2, _unmeasured(UNMEASURED))
    before = _cli_rows(pg_url, tmp_path, None)
    assert before[run_id][0] == 2 and before[run_id][1] > 0
    assert before[UNMEASURED] == (2, None)
    as_was = _served_rows(pg_url, tmp_path, None)  # the SQL path, as it was
    assert as_was.keys() == before.keys()
    for rid, row in before.items():  # PostgreSQL sums a run's rows in its plan's order
        assert as_was[rid][0] == row[0] and _same(as_was[rid][1], row[1]), (rid, as_was[rid], row)
    _drop(pg_url, series_url)
    served = _served_rows(pg_url, tmp_path, series_url)
    cli_after = _cli_rows(pg_url, tmp_path, series_url)
    for rid in (run_id, UNMEASURED):
        assert served[rid][0] == cli_after[rid][0] == before[rid][0], rid
        assert _same(served[rid][1], cli_after[rid][1]), (rid, served[rid], cli_after[rid])
        assert _close(served[rid], before[rid]), (rid, served[rid], before[rid])
    assert served[UNMEASURED] == (2, None)  # nothing measured it: n/a, never 0
    for rid in (run_id, UNMEASURED):  # the run page: show's figures, the store's rows read whole
        shown = SHOWN[(series_url, rid)]
        assert shown[0] == shown[2] == shown[3] == tiers.N and len(shown) == 4, shown
        assert shown == _cli_show(pg_url, tmp_path, rid, series_url), rid
    # Without the store the dropped days are gone, as ``gpuledger runs`` reads them.
    gone = _served_rows(pg_url, tmp_path, None)
    assert gone[run_id] == _cli_rows(pg_url, tmp_path, None)[run_id] == (0, None)


def test_the_server_run_list_of_a_run_with_one_day_dropped_adds_only_that_day(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """One of the run's two days dropped: the ledger's rows of the other day, and the tiered
    day's sums once each (a day tiered and still held is not added again)."""
    run_id, _, _ = tiers._ingested(pg_url)
    before = _cli_rows(pg_url, tmp_path, None)[run_id]
    scraped = _scraped(pg_url, None)["runs"][run_id]
    _half_dropped(pg_url, series_url, tmp_path)
    with Ledger(pg_url) as led:
        held = led.read(lambda c: server_queries.busy_by_run(c, [run_id]))[run_id]
        assert held[1] is not None and held[1] < before[1] * 3600  # SQL alone misses a day
    served = _served_rows(pg_url, tmp_path, series_url)[run_id]
    assert served[0] == before[0] and _close(served, before), (served, before)
    assert _same(served[1], _cli_rows(pg_url, tmp_path, series_url)[run_id][1])
    # /metrics: the held day's rows summed in SQL and the dropped day's sums, the counters of before.
    after = _scraped(pg_url, series_url)
    assert after["rows_read"] == 0 and _near(after["runs"][run_id][0], scraped[0])
    for uuid in GPUS:
        assert all(_near(a, b) for a, b in zip(after["runs"][run_id][1][uuid], scraped[1][uuid], strict=True)), uuid


def test_expired_tiered_days_are_gone_from_the_server_run_list(pg_url: str, series_url: str, tmp_path: Path) -> None:
    run_id, _, _ = tiers._ingested(pg_url)
    _drop(pg_url, series_url)
    # the run's days are 10 and 11 days old
    assert tiers.expire_store_days(pg_url, series_url, series_days=5, now=tiers.NOW) == 2
    with Ledger(pg_url) as led:
        assert led.read(lambda c: server_queries.busy_by_run(c, [run_id], tiered=True)) == {}
    assert _cli_rows(pg_url, tmp_path, series_url)[run_id] == (0, None)


def _scraped(pg_url: str, series: str | None) -> dict[str, Any]:
    """A fresh server process's first /metrics figures (prom/ledger_source.py) of every run of the
    last month: per run, its CPU seconds and per GPU (busy s, energy J); and the rows it read."""
    with Ledger(pg_url, series=series) as led:
        source = LedgerSource(led, recent_s=30 * DAY_S)
        figures = source.figures()
    out: dict[str, Any] = {f.key.run_id: (f.cpu_s, {g.uuid: (g.busy_s, g.energy_j) for g in f.gpus}) for f in figures}
    return {"runs": out, "rows_read": source.rows_read}


def _near(a: float | None, b: float | None) -> bool:
    return a is None if b is None else a is not None and abs(a - b) <= SLACK


def test_metrics_counters_of_a_tiered_run_count_its_dropped_days_with_the_store(pg_url: str, series_url: str) -> None:
    """Busy time, energy and CPU of a run new to the scraper are summed once, in SQL, plus the
    dropped days' sums of the audit trail: the counters of before the drop, no row read one by one."""
    run_id, _, _ = tiers._ingested(pg_url, 2, _unmeasured(UNMEASURED))
    before = _scraped(pg_url, None)
    assert before["rows_read"] == 0 and before["runs"][UNMEASURED] == (None, {g: (None, None) for g in GPUS})
    _drop(pg_url, series_url)
    after = _scraped(pg_url, series_url)
    assert after["rows_read"] == 0  # the seqs add up: the summed path, not a row-by-row read from 0
    for rid in (run_id, UNMEASURED):
        (cpu_b, gpus_b), (cpu_a, gpus_a) = before["runs"][rid], after["runs"][rid]
        assert _near(cpu_a, cpu_b) and gpus_a.keys() == gpus_b.keys() == set(GPUS), (rid, before, after)
        for uuid in GPUS:
            assert all(_near(a, b) for a, b in zip(gpus_a[uuid], gpus_b[uuid], strict=True)), (rid, uuid)
    assert before["runs"][run_id][0] > 0 and after["runs"][UNMEASURED] == before["runs"][UNMEASURED]
    # Without the store the dropped days are gone, as every other read without it finds them.
    gone = _scraped(pg_url, None)["runs"][run_id]
    assert gone[0] is None and all(v == (None, None) for v in gone[1].values())


def test_the_run_list_reads_the_tiered_sums_of_all_its_runs_at_once(pg_url: str, series_url: str) -> None:
    """Two tiered runs and one never tiered: the same few statements as for one, the store unread."""
    run_id, _, _ = tiers._ingested(pg_url, 2, _unmeasured(UNMEASURED), _other_run())
    _drop(pg_url, series_url)
    with Ledger(pg_url) as led:
        ids = led.read(lambda c: [r.id for r in server_queries.list_runs(c, None)])
        assert len(ids) == 3
        statements: list[str] = []
        sa.event.listen(led.database.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
        both = led.read(lambda c: server_queries.busy_by_run(c, ids, tiered=True))
        many = len(statements)
        one = led.read(lambda c: server_queries.busy_by_run(c, [run_id], tiered=True))
    assert both[run_id][0] == one[run_id][0] and _same(both[run_id][1], one[run_id][1]), (both, one)
    assert both[UNMEASURED] == (2, None) and set(both) == set(ids)
    assert many == len(statements) - many == 5, statements  # intervals, day sums, entries, marks, windows
