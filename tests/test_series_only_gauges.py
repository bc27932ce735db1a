"""A series-only run's host CPU, GPU throttle time and last-row gauges (store/series_streams.py):
``/metrics`` shows them as for the same pushes kept in the ledger, a resent batch and a late row
filling a gap change nothing they should not, and a run created before migration 20 reads n/a
for the sums until ``gpuledger db migrate --series URL`` recomputes them from the store.

Real ``gpuledger serve`` processes on PostgreSQL, into both kinds of store (the compact PostgreSQL
store and ClickHouse on chDB); the unit-level property on real SQLite.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import test_series_only as only_tests
import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.prom.names import THROTTLE_REASONS
from gpuledger.prom.series import RunFigures
from gpuledger.store import Ledger, migrations, schema, series_streams
from gpuledger.store.engine import Database
from gpuledger.store.schema_series_streams import GAUGES, REASONS
from server_support import ServerProcess, bearer, setup_accounts
from test_series_live import HALF, N
from test_series_only import _post

pg_url, series_url, pg_store_url = tiers.pg_url, tiers.series_url, only_tests.pg_store_url

LATE = N - 10  # the first push holds seqs [HALF, LATE); the second all of them


def _serve(pg_url: str, series_url: str | None, tmp_path: Path) -> ServerProcess:
    """A server (series-only with a store), no liveness sweep: the runs stay as pushed."""
    env = {"GPULEDGER_CLOSE_AFTER_DAYS": "400"}
    if series_url is not None:
        env |= {"GPULEDGER_SERIES": series_url, "GPULEDGER_SERIES_ONLY": "1"}
    return ServerProcess(pg_url, log=tmp_path / "serve.log", env=env)


def _whole() -> dict[str, Any]:
    """A run that ended two minutes ago (recent: /metrics shows it) with gauges that differ row
    by row, throttle time of two reasons on some rows and none on others, and CPU finer than µs."""
    body = tiers._body(time.time() - N * 5.0 - 120.0)
    for r in body["gpu_intervals"]:
        seq, gpu = r["seq"], int(r["device_uuid"].rsplit("-", 1)[1])  # GPU-0, GPU-1
        r["power_max_w"] = 100.0 + seq + gpu / 4
        r["mem_used_last_b"] = 10**9 + seq * 4096 + gpu
        r["temp_max_c"] = None if seq == N - 1 and gpu else 40.0 + seq % 7
        r["throttle_s"] = None if seq % 3 == 0 else {"power": 0.25 + seq * 1.1e-7, "thermal": 0.0123456789}
    for r in body["host_intervals"]:
        r["cpu_s"] += r["seq"] * 3.3e-7
    return body


def _pushes(whole: dict[str, Any]) -> list[dict[str, Any]]:
    """Seqs [HALF, LATE) of a running run; then the whole run (its first half late, behind what the
    store holds, the rest past it, [HALF, LATE) sent again); then that again."""
    first = copy.deepcopy(whole)
    first["run"] = {k: v for k, v in first["run"].items() if k not in ("status", "ended_at", "exit_code")}
    first["final"] = False
    for series in ("gpu_intervals", "host_intervals"):
        first[series] = [r for r in first[series] if HALF <= r["seq"] < LATE]
    return [first, whole, copy.deepcopy(whole)]


def _as_plain(body: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The same push for another run id, its GPUs renamed (a GPU belongs to one run at a time)."""
    plain = copy.deepcopy(body)
    plain["run"]["id"] = run_id
    for d in plain["devices"]:
        d["uuid"] += "-plain"
    for r in plain["gpu_intervals"]:
        r["device_uuid"] += "-plain"
    return plain


def _push_pair(
    pg_url: str, series_url: str, tmp_path: Path, pushes: list[dict[str, Any]], tokens: Any
) -> tuple[str, str]:
    """``pushes`` to a plain server as one run and to a series-only server as another: the ids."""
    plain_id = str(uuid.uuid4())
    with _serve(pg_url, None, tmp_path) as server:
        for body in pushes:
            got = _post(server, tokens.agent_a, _as_plain(body, plain_id))
            assert got.status_code == 200, got.text
    with _serve(pg_url, series_url, tmp_path) as server:
        for body in pushes:
            got = _post(server, tokens.agent_a, body)
            assert got.status_code == 200, got.text
    return plain_id, pushes[0]["run"]["id"]


def _figures(pg_url: str) -> dict[str, RunFigures]:
    with Ledger(pg_url) as led:
        return {f.key.run_id: f for f in LedgerSource(led).figures()}


def _shown(fig: RunFigures) -> tuple[Any, ...]:
    """What /metrics shows of a run beyond busy time and energy, per GPU in index order."""
    gpus = [(g.index, g.throttle_s, g.power_w, g.memory_used_b, g.temperature_c) for g in fig.gpus]
    return fig.cpu_s, gpus


def _scrape(server: ServerProcess, token: str, run_ids: tuple[str, str]) -> list[dict[tuple[Any, ...], float]]:
    """Per run of ``run_ids``, its /metrics samples: (sample name, gpu index, reason) -> value."""
    got = httpx.get(server.url + "/metrics", headers=bearer(token), timeout=60)
    assert got.status_code == 200, got.text
    out: list[dict[tuple[Any, ...], float]] = [{}, {}]
    for family in text_string_to_metric_families(got.text):
        for s in family.samples:
            if s.labels.get("run_id") in run_ids and not s.name.endswith(("_info", "_created")):
                key = (s.name, s.labels.get("gpu"), s.labels.get("reason"))
                out[run_ids.index(s.labels["run_id"])][key] = s.value
    return out


def test_metrics_show_a_series_only_runs_cpu_throttle_and_gauges_as_the_same_rows_in_the_ledger(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole = _whole()
    plain_id, only_id = _push_pair(pg_url, series_url, tmp_path, _pushes(whole), tokens)
    for _ in range(2):  # a process's first read of the runs, and what it keeps at the next scrape
        figures = _figures(pg_url)
        plain, only = _shown(figures[plain_id]), _shown(figures[only_id])
        assert only == plain
    cpu, gpus = plain
    assert cpu == pytest.approx(sum(r["cpu_s"] for r in whole["host_intervals"]), abs=N * 1e-6)
    last = {r["device_uuid"]: r for r in whole["gpu_intervals"] if r["seq"] == N - 1}  # by seq, not arrival
    assert [g[2:] for g in gpus] == [tuple(r[c] for c in GAUGES) for r in last.values()]
    assert gpus[1][4] is None  # the last row measured no temperature: n/a, not an earlier row's
    assert all(set(g[1]) == {"power", "thermal"} for g in gpus)
    assert gpus[0][1]["thermal"] == round(0.0123456789 * 1e6) * (N - N // 3 - (N % 3 > 0)) / 1e6
    # the real /metrics of the series-only server, and of a server without the store
    for store in (series_url, None):
        with _serve(pg_url, store, tmp_path) as server:
            plain_samples, only_samples = _scrape(server, tokens.admin, (plain_id, only_id))
        near = ("gpuledger_gpu_busy_seconds_total", "gpuledger_gpu_energy_joules_total")  # whole-day sums
        assert {k: v for k, v in only_samples.items() if k[0] not in near} == {
            k: v for k, v in plain_samples.items() if k[0] not in near
        }
        assert only_samples.keys() == plain_samples.keys()
        names = {k[0] for k in only_samples}
        assert {
            "gpuledger_run_cpu_seconds_total",
            "gpuledger_gpu_throttle_seconds_total",
            "gpuledger_gpu_power_watts",
            "gpuledger_gpu_memory_used_bytes",
            "gpuledger_gpu_temperature_celsius",
        } <= names


def test_a_run_list_shows_the_pair_alike(pg_url: str, pg_store_url: str, tmp_path: Path) -> None:
    """``gpuledger runs`` and ``GET /runs`` show no CPU, throttle or gauge column; what they show
    (GPUs, busy time) is alike for the pair of runs pushed the gauges' way."""
    tokens = setup_accounts(pg_url)
    plain_id, only_id = _push_pair(pg_url, pg_store_url, tmp_path, _pushes(_whole()), tokens)
    with _serve(pg_url, pg_store_url, tmp_path) as server:
        got = httpx.get(server.url + "/api/v1/runs", headers=bearer(tokens.admin), timeout=60)
    assert got.status_code == 200, got.text
    out = CliRunner().invoke(cli, ["runs", "--json", "--db", pg_url], env={"GPULEDGER_HOME": str(tmp_path / "h")})
    assert out.exit_code == 0, out.output
    for rows in (got.json(), json.loads(out.output)):
        by_id = {r["id"]: r for r in rows}
        plain, only = by_id[plain_id], by_id[only_id]
        assert only["gpus"] == plain["gpus"] == 2
        assert only["busy_gpu_hours"] == pytest.approx(plain["busy_gpu_hours"], rel=1e-9)


def _back_to_19(pg_url: str) -> None:
    """The ledger as version 19 left it: no series_streams."""
    db = Database(pg_url)
    try:
        db.write(lambda conn: conn.execute(sa.text("DROP TABLE series_streams")))
        db.write(
            lambda conn: conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 20))
        )
        assert migrations.upgrade(db) == migrations.LATEST
    finally:
        db.close()


def test_a_run_series_only_before_migration_20_reads_na_until_db_migrate_series_recomputes_it(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    tokens = setup_accounts(pg_url)
    whole = _whole()
    first, final, _ = _pushes(whole)
    plain_id, only_id = _push_pair(pg_url, pg_store_url, tmp_path, [first], tokens)
    _back_to_19(pg_url)  # the first push was taken by a version-19 server
    with Ledger(pg_url) as led:
        assert led.read(series_streams.incomplete_runs) == [only_id]
    with _serve(pg_url, None, tmp_path) as server:
        assert _post(server, tokens.agent_a, _as_plain(final, plain_id)).status_code == 200
    with _serve(pg_url, pg_store_url, tmp_path) as server:
        assert _post(server, tokens.agent_a, final).status_code == 200
    figures = _figures(pg_url)
    plain, only = _shown(figures[plain_id]), _shown(figures[only_id])
    assert plain[0] is not None and all(g[1] for g in plain[1])
    assert only[0] is None and all(g[1] == {} for g in only[1])  # the sums miss the first push: n/a
    assert [g[2:] for g in only[1]] == [g[2:] for g in plain[1]]  # the gauges of a later row: shown
    env = {"GPULEDGER_HOME": str(tmp_path / "h")}
    out = CliRunner().invoke(cli, ["db", "migrate", "--db", pg_url, "--series", pg_store_url], env=env)
    assert out.exit_code == 0, out.output
    assert "recomputed the host CPU and throttle sums of 1 series-only runs" in out.output
    with Ledger(pg_url) as led:
        assert led.read(series_streams.incomplete_runs) == []
    figures = _figures(pg_url)
    plain, only = _shown(figures[plain_id]), _shown(figures[only_id])
    assert only[0] == pytest.approx(plain[0], abs=N * 1e-3)  # the store keeps CPU to its units
    for p, o in zip(plain[1], only[1], strict=True):
        assert o[1].keys() == p[1].keys() == {"power", "thermal"}
        assert all(o[1][k] == pytest.approx(p[1][k], abs=N * 1e-3) for k in p[1])
        assert o[2:] == pytest.approx(p[2:])  # gauges of the store's last row, to its units


def test_migration_20_marks_the_streams_of_existing_series_only_runs_incomplete(ledger_url: str) -> None:
    """On SQLite and PostgreSQL: a version-19 ledger's series-only streams get a row each, not
    complete, at the highest seq their segments hold; a run without segments gets none."""
    from gpuledger.core.model import RunRecord
    from gpuledger.store import codec

    Ledger(ledger_url).close()  # at LATEST
    db = Database(ledger_url)

    def seed(conn: sa.Connection) -> None:
        for rid in ("old", "plain"):
            run = RunRecord(id=rid, command=["x"], user="u", host="h", cwd="/", started_at=0.0)
            conn.execute(sa.insert(schema.runs).values(**codec.run_row(run)))
        segs = [("GPU-0", 0, 4), ("GPU-0", 6, 9), ("", 0, 9)]
        conn.execute(
            sa.insert(schema.series_segments),
            [
                {"run_id": "old", "device_uuid": u, "first_seq": a, "last_seq": b, "t0": a, "t1": b + 1}
                for u, a, b in segs
            ],
        )
        conn.execute(sa.text("DROP TABLE series_streams"))
        # back to 19: the later migrations are applied again (21 skips a table partitioned already)
        conn.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 20))

    try:
        db.write(seed)
        assert migrations.upgrade(db) == migrations.LATEST
        got = db.read(lambda conn: series_streams.read(conn, ["old", "plain"]))
        assert {k: (r["complete"], r["last_seq"], r["cpu_us"]) for k, r in got.items()} == {
            ("old", "GPU-0"): (False, 9, None),
            ("old", ""): (False, 9, None),
        }
        assert db.read(series_streams.incomplete_runs) == ["old"]
    finally:
        db.close()


def test_every_throttle_reason_metrics_counts_has_a_column() -> None:
    assert tuple(THROTTLE_REASONS) == REASONS


_COLS = ("device_uuid", "seq", "throttle_s", *GAUGES)
_row = st.fixed_dictionaries(
    {
        "throttle_s": st.one_of(st.none(), st.dictionaries(st.sampled_from(REASONS[:3]), st.floats(0, 5), max_size=2)),
        "power_max_w": st.one_of(st.none(), st.floats(0, 700)),
        "mem_used_last_b": st.one_of(st.none(), st.integers(0, 2**40)),
        "temp_max_c": st.one_of(st.none(), st.floats(0, 100)),
        "cpu_s": st.floats(0, 100),
    }
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_row, min_size=1, max_size=12), st.randoms(use_true_random=False), st.integers(1, 4))
def test_streams_sum_each_new_row_once_and_keep_the_gauges_of_the_highest_seq(
    rows: list[dict[str, Any]], rnd: Any, pushes: int
) -> None:
    """Rows of two GPUs and the host arriving in any order and grouping (each once: the segments
    drop held rows) leave the sums of all of them and the gauges of each GPU's highest seq."""
    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE runs (id VARCHAR PRIMARY KEY)"))
        schema.series_streams.create(conn)
        conn.execute(sa.text("INSERT INTO runs VALUES ('r')"))
    gpu = [(f"GPU-{i % 2}", i // 2, r["throttle_s"], *(r[c] for c in GAUGES)) for i, r in enumerate(rows)]
    host = [(i, r["cpu_s"]) for i, r in enumerate(rows)]
    order = list(range(len(rows)))
    rnd.shuffle(order)
    cut = [*sorted(rnd.sample(range(1, len(rows)), min(pushes, len(rows)) - 1)), len(rows)]  # the last takes the rest
    start = 0
    for end in cut:
        part = order[start:end]
        with engine.begin() as conn:
            series_streams.add(conn, "r", [gpu[i] for i in part], _COLS, [host[i] for i in part], ("seq", "cpu_s"))
        start = end
    with engine.begin() as conn:
        got = series_streams.read(conn, ["r"])
    want = {
        (w["run_id"], w["device_uuid"]): w for w in series_streams.stream_rows("r", gpu, _COLS, host, ("seq", "cpu_s"))
    }
    assert got == want
    for (_, stream), r in got.items():
        if stream:
            top = max((g for g in gpu if g[0] == stream), key=lambda g: g[1])
            assert (r["last_seq"], *(r[c] for c in GAUGES)) == (top[1], *top[3:])
