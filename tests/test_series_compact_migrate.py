"""``gpuledger db migrate --layout compact --series URL`` (store/series_compact.py) on a populated
PostgreSQL team ledger, into the compact PostgreSQL store and ClickHouse on chDB.

Several finished runs of two projects and teams, GPUs and days, with host streams, one of them
tiered by retention (its first day dropped from PostgreSQL), one still recording: after the
migration the ledger holds no raw row of the finished runs, ``audit verify`` (and with the store)
passes as before, and ``report run``, ``show``, ``cost``, ``runs`` and chargeback give the figures
they gave before; rebuilt from the day sums, ``gpu_rollups`` are those built from the raw rows. The
running run is kept and moved by a later call once it has ended. A call killed half-way (a real
SIGKILL of the CLI) or failing right after a store write is completed by the next call, nothing
stored twice; a store holding other rows for a run leaves that run as it was.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

import test_series_tier as tiers
from gpuledger.cli.main import cli
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.series import quantum
from gpuledger.store import (
    Ledger,
    audit,
    partitions,
    rollup_stale,
    schema,
    series_compact,
    series_compact_read,
    series_segments,
    series_streams,
    series_tier,
)
from gpuledger.store import metrics_queries as mq
from gpuledger.store.retention import DAY_S, Policy, _tampered, run_retention
from gpuledger.store.schema_series_streams import REASONS
from server_support import bearer, devices_doc, gpu_rows, host_of, host_rows, run_doc, setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY, _client

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
N = 60  # 5 s intervals per device and run
MIDNIGHT = (TODAY - 10) * DAY_S  # the tiered run crosses it; retention drops the day before it


@pytest.fixture
def pg_store_url(tmp_path: Path) -> Iterator[str]:
    yield from tiers.store_url("postgres", tmp_path, "compact_t")


def _body(start: float, devices: int, project: str, team: str, *, running: bool = False, n: int = N) -> dict[str, Any]:
    host = host_of(project)
    # Values in the store's units (ms, mJ, ...), as an agent's sums of its ticks are: the store keeps
    # them exactly (finer parts it rounds away, tests/test_series_tier.py).
    gpu = gpu_rows(n, devices=devices, start=start, host=host)
    fields = {"status": "running"} if running else {"status": "succeeded", "ended_at": start + n * 5.0, "exit_code": 0}
    run = run_doc(project=project, started_at=start, **fields)
    run["labels"]["team"] = team
    return {
        "run": run,
        "devices": devices_doc(devices, host),
        "gpu_intervals": gpu,
        "host_intervals": host_rows(n, start=start),
        "final": not running,
    }


def _parts(body: dict[str, Any], rows: int = 4000) -> list[dict[str, Any]]:
    """``body`` as the pushes of an agent (the server takes 8 MiB a request): the run recording
    until the last, which carries its end."""
    gpu, host = body["gpu_intervals"], body["host_intervals"]
    cuts = range(0, max(len(gpu), len(host)), rows)
    out = []
    for i, at in enumerate(cuts):
        part = {**body, "gpu_intervals": gpu[at : at + rows], "host_intervals": host[at : at + rows]}
        if i < len(cuts) - 1:
            part["run"] = {k: v for k, v in body["run"].items() if k not in ("status", "ended_at", "exit_code")}
            part["final"] = False
        out.append(part)
    return out


@dataclass
class Ledgered:
    tiered: str  # its first day tiered into the store and dropped from PostgreSQL
    finished: list[str]  # every finished run, oldest first (the tiered one first)
    running: dict[str, Any]  # the body of the run still recording
    agent: dict[str, str]  # project -> its agent's Authorization header
    gone: dict[str, Any] | None = None  # the body of a run all of whose days were tiered and dropped


def _populate(pg_url: str, series_url: str, big: int = N, *, gone: bool = False) -> Ledgered:
    """The runs; ``big``: the intervals per device of the third (a long run, 2 GPUs, across midnights);
    ``gone``: and a run of 2 GPUs across the midnight before the day the first crosses into, its
    both days tiered and dropped by retention (not in ``finished``)."""
    tokens = setup_accounts(pg_url)
    agent = {"A": bearer(tokens.agent_a), "B": bearer(tokens.agent_b)}
    whole_day = _body(MIDNIGHT - DAY_S - N / 2 * 5.0, 2, "B", "nlp") if gone else None
    bodies = [
        ("A", _body(MIDNIGHT - N / 2 * 5.0, 2, "A", "vision")),  # across a midnight
        ("A", _body(MIDNIGHT + DAY_S + 3600, 1, "A", "vision")),  # GPU-0 again, a day on
        ("B", _body(MIDNIGHT + 2 * DAY_S + 7200, 2, "B", "nlp", n=big)),
        ("B", _body(MIDNIGHT + 2 * DAY_S + 9000 + big * 5.0, 1, "B", "speech")),  # GPU 0 of B's host, after it
    ]
    running = _body(MIDNIGHT + 3 * DAY_S + big * 5.0, 1, "A", "vision", running=True)
    with _client(pg_url) as client, Ledger(pg_url) as led:
        for project, body in [*bodies, ("A", running), *([("B", whole_day)] if whole_day else [])]:
            for part in _parts(body):
                got = client.post("/api/v1/ingest", json=part, headers=agent[project])
                assert got.status_code == 200 and got.json()["quarantined"] == [], got.text
        materialise_rollups(led)
        partitions.maintain(led.database)
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:  # the day before MIDNIGHT goes; the tiered run's second day stays
            cut = MIDNIGHT + 3600
            policy = Policy(raw_days=7, drop_partitions=True, log_days=None, capacity_days=None)
            report = run_retention(led, policy, actor="test", now=cut + 7 * DAY_S, tier=tier)
            dropped = [tiers._date(day) for day in ([TODAY - 12] if gone else []) + [TODAY - 11]]
            assert report.days is not None and report.days.dropped == dropped, report.days
    finally:
        tier.store.close()
    ids = [b["run"]["id"] for _, b in bodies]
    return Ledgered(ids[0], ids, running, agent, whole_day)


def _env(tmp_path: Path, series_url: str) -> dict[str, str]:
    return {
        "GPULEDGER_RATES": "", "GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": series_url,
        "GPULEDGER_CLOSE_AFTER_DAYS": str(OPEN_DAYS),
    }  # fmt: skip


def _cli(env: dict[str, str], *args: str, code: int = 0) -> Any:
    out = CliRunner().invoke(cli, list(args), env=env)
    assert out.exit_code == code, out.output
    return out


def _json(env: dict[str, str], *args: str) -> Any:
    return json.loads(_cli(env, *args).stdout)


def _figures(pg_url: str, env: dict[str, str], run_ids: list[str]) -> dict[str, Any]:
    """What a user reads of the runs: report run, show, cost, runs and chargeback."""
    db = ["--db", pg_url]
    out: dict[str, Any] = {}
    for run_id in run_ids:
        report = _json(env, "report", "run", run_id, *db, "--format", "json")
        shown = _json(env, "show", run_id, "--json", *db)
        shown["busy_gpu_hours"] = round(shown["busy_gpu_hours"], 6)  # ms units in the store
        cost = _json(env, "cost", run_id, *db, "--format", "json")
        out[run_id] = {"report": report, "show": shown, "cost": cost}
    listed = _json(env, "runs", *db, "--format", "json", "--limit", "20")
    out["runs"] = [r for r in listed if r["status"] != "running"]  # its wall time grows as we read
    since, until = tiers._date(TODAY - 12), tiers._date(TODAY)
    for by in ("team", "project,user,gpu_model"):
        out[by] = _json(
            env, "report", "chargeback", *db, "--from", since, "--to", until, "--by", by, "--format", "json"
        )
    return out


def _diff(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two JSON documents differ (paths), for a readable failure."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(a.keys() | b.keys(), key=str) for d in _diff(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _diff(x, y, f"{at}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):  # sums added in another order
        return [] if a == pytest.approx(b, rel=1e-9, abs=1e-12) else [f"{at}: {a!r} != {b!r}"]
    return [] if a == b or at.endswith(".generated_at") else [f"{at}: {a!r} != {b!r}"]


def _metrics_sums(conn: sa.Connection, run_ids: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (run, GPU or "" for the host): what /metrics sums of a plain run's rows (µs)."""
    out = {(g["run_id"], g["device_uuid"]): {r: g[f"throttle_{r}"] for r in REASONS}
           for g in mq.whole_gpu_sums(conn, run_ids, REASONS)}  # fmt: skip
    out |= {(h["run_id"], ""): {"cpu_us": h["cpu_us"]} for h in mq.whole_host_sums(conn, run_ids)}
    return out


def _stream_sums(conn: sa.Connection, run_ids: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """The same of series-only runs, from their ``series_streams``."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for key, row in series_streams.read(conn, run_ids).items():
        out[key] = {"cpu_us": series_streams.cpu_us(row)} if key[1] == "" else series_streams.throttle_us(row)
    return out


def _rollups(led: Ledger, run_ids: list[str]) -> list[dict[str, Any]]:
    t = schema.gpu_rollups

    def read(conn: sa.Connection) -> list[dict[str, Any]]:
        q = sa.select(t).where(t.c.run_id.in_(run_ids)).order_by(t.c.run_id, t.c.day, t.c.gpu_name, t.c.measured)
        return [dict(r) for r in conn.execute(q).mappings()]

    return led.read(read)


def _rebuilt_rollups(pg_url: str, run_ids: list[str]) -> list[dict[str, Any]]:
    """The runs' ``gpu_rollups`` dropped and written again from what the ledger holds now (frozen
    ones, of runs whose raw days retention dropped, stay as they were)."""
    with Ledger(pg_url) as led:
        led.write(lambda conn: rollup_stale.drop_rollups(conn, run_ids))
        materialise_rollups(led)
        return _rollups(led, run_ids)


def _raw_rows(pg_url: str, run_id: str) -> tuple[int, int]:
    with Ledger(pg_url) as led:
        return len(led.gpu_intervals(run_id)), len(led.host_intervals(run_id))


def _stored(series_url: str, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    store = series_tier.open_store(series_url, create=False)
    try:
        return store.gpu_intervals(run_id), store.host_intervals(run_id)
    finally:
        store.close()


def _quantized(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The body's rows as the store returns them (the ledger's columns, quantized), in read order."""
    gpu = [quantum.quantize_gpu({c: r.get(c) for c in series_tier.GPU_COLUMNS}) for r in body["gpu_intervals"]]
    host = [quantum.quantize_host({c: r.get(c) for c in series_tier.HOST_COLUMNS}) for r in body["host_intervals"]]
    return sorted(gpu, key=lambda r: (r["device_uuid"], r["seq"])), sorted(host, key=lambda r: r["seq"])


def test_a_populated_ledger_moves_to_the_compact_layout_with_the_same_figures(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    led_ = _populate(pg_url, series_url)
    env = _env(tmp_path, series_url)
    finished = led_.finished
    assert _raw_rows(pg_url, led_.tiered) == (N, N // 2)  # the second day only: the first was tiered and dropped
    verify = ["audit", "verify", "--db", pg_url]
    _cli(env, *verify)
    _cli(env, *verify, "--series", series_url)
    before = _figures(pg_url, env, finished)
    with Ledger(pg_url) as led:
        rollups = _rollups(led, finished)
        plain = led.read(lambda conn: _metrics_sums(conn, finished[1:]))  # the tiered run's: not whole in SQL
    assert len({r["run_id"] for r in rollups}) == len(finished)
    migrate = ["db", "migrate", "--db", pg_url, "--layout", "compact", "--series", series_url]

    dry = _cli(env, *migrate, "--dry-run")
    rows = (N + N // 2) + 2 * N + 3 * N + 2 * N  # the tiered run's second day; 1 GPU, 2 GPUs, 1 GPU, each + host
    assert f"would move 4 runs ({rows} rows) into the compact layout" in dry.stdout, dry.output
    assert "1 runs kept in PostgreSQL for now" in dry.stdout and "still recording" in dry.stderr, dry.output
    assert _raw_rows(pg_url, finished[1]) == (N, N) and _stored(series_url, finished[1]) == ([], [])

    first = _cli(env, *migrate)
    assert f"moved and checked 4 runs ({rows} rows)" in first.stdout, first.output
    assert "[1/5] run " in first.stderr and "[5/5] run " in first.stderr, first.output
    for run_id in finished:
        assert _raw_rows(pg_url, run_id) == (0, 0)  # no raw row left in PostgreSQL
    assert _raw_rows(pg_url, led_.running["run"]["id"]) == (N, N)  # still recording: kept
    tiered_gpu, tiered_host = _stored(series_url, led_.tiered)
    assert len(tiered_gpu) == 2 * N and len(tiered_host) == N  # both days, each row once

    _cli(env, *verify)
    checked = _cli(env, *verify, "--series", series_url)
    assert "4 series-only runs checked" in checked.output and "1 tiered run days checked" in checked.output
    assert _diff(before, _figures(pg_url, env, finished)) == []
    with Ledger(pg_url) as led:
        assert _rollups(led, finished) == rollups  # kept as they were
        # /metrics' CPU and throttle sums and last-row gauges, from series_streams now
        assert led.read(lambda conn: _stream_sums(conn, finished[1:])) == plain
        moved = led.read(lambda conn: [p for p in audit_payloads(conn, series_compact.ACTION)])
    assert sorted(moved) == sorted(finished)
    rebuilt = _rebuilt_rollups(pg_url, finished)  # from the day sums now (the tiered run's stay frozen)
    assert len(rebuilt) == len(rollups)
    for want, got in zip(rollups, rebuilt, strict=True):
        assert got == {k: pytest.approx(v, rel=1e-9, abs=1e-6) if isinstance(v, float) else v for k, v in want.items()}

    # The running run ends; a later call moves it, and leaves the others as they are.
    ended = copy.deepcopy(led_.running)
    ended["run"].update(status="succeeded", ended_at=ended["run"]["started_at"] + N * 5.0, exit_code=0)
    ended["final"] = True
    with _client(pg_url) as client:
        assert client.post("/api/v1/ingest", json=ended, headers=led_.agent["A"]).status_code == 200
    again = _cli(env, *migrate)
    assert "moved and checked 1 runs" in again.stdout and "4 runs compact already" in again.stdout, again.output
    assert _stored(series_url, ended["run"]["id"]) == _quantized(ended)
    _cli(env, *verify, "--series", series_url)


def audit_payloads(conn: sa.Connection, action: str) -> list[str]:
    a = schema.audit_log.c
    return [o.removeprefix("run:") for o in conn.scalars(sa.select(a.object).where(a.action == action))]


class _Crashing:
    """The real store, but the process dies (raises) right after its first write of ``run_id``."""

    def __init__(self, store: Any, run_id: str) -> None:
        self.store, self.run_id, self.written = store, run_id, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write(self, run_id: str, *args: Any, **kwargs: Any) -> int:
        n = self.store.write(run_id, *args, **kwargs)
        if run_id == self.run_id:
            raise RuntimeError("killed after the store took the rows")
        self.written += n
        return n


def test_a_failure_after_a_store_write_leaves_the_run_as_it_was_and_the_next_call_finishes_it(
    pg_url: str, series_url: str
) -> None:
    led_ = _populate(pg_url, series_url)
    victim = led_.finished[2]
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:
            crashing = series_tier.Tier(_Crashing(tier.store, victim), tier.url)  # type: ignore[arg-type]
            with pytest.raises(RuntimeError, match="killed after the store took the rows"):
                series_compact.compact(led, crashing, actor="test", tampered=_tampered)
            assert _raw_rows(pg_url, victim) == (2 * N, N)  # its transaction rolled back
            assert _raw_rows(pg_url, led_.finished[1]) == (0, 0)  # the run before it was moved
            # though the store took its GPU rows (the first batch; the host's is the next)
            assert len(tier.store.gpu_intervals(victim)) == 2 * N and tier.store.host_intervals(victim) == []
            counting = _Crashing(tier.store, "none")
            done = series_compact.compact(led, series_tier.Tier(counting, tier.url), actor="test", tampered=_tampered)  # type: ignore[arg-type]
            assert victim in done.moved and led_.finished[1] in done.done and not done.failed
            assert counting.written == N + 2 * N  # the victim's host rows and the last run's: no GPU row again
            assert audit.verify(led, close_after_days=OPEN_DAYS).ok
        for body_run in led_.finished[1:]:
            assert _raw_rows(pg_url, body_run) == (0, 0)
        gpu, host = tier.store.gpu_intervals(victim), tier.store.host_intervals(victim)
        assert len(gpu) == 2 * N and len(host) == N  # each once
    finally:
        tier.store.close()


def test_a_migration_killed_half_way_is_finished_by_the_next_call(pg_url: str, series_url: str, tmp_path: Path) -> None:
    """SIGKILL of the CLI once the second run's progress line is out, while it moves the third, a
    long run (16,000 GPU intervals): each run is moved whole or not at all, and the next call
    finishes the rest without storing a row twice."""
    big = 8_000
    led_ = _populate(pg_url, series_url, big=big)
    env = _env(tmp_path, series_url)
    before = _figures(pg_url, env, led_.finished)
    migrate = ["db", "migrate", "--db", pg_url, "--layout", "compact", "--series", series_url]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuledger", *migrate],
        env={**os.environ, **env}, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("[2/5] "):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert "moved and checked" in lines[-1], lines
    assert _raw_rows(pg_url, led_.finished[1]) == (0, 0)
    long_run = led_.finished[2]
    assert _raw_rows(pg_url, long_run) == (2 * big, big)  # killed inside its transaction: as it was
    rest = _cli(env, *migrate)
    assert "moved and checked 2 runs" in rest.stdout and "2 runs compact already" in rest.stdout, rest.output
    for run_id in led_.finished:
        assert _raw_rows(pg_url, run_id) == (0, 0)
    gpu, host = _stored(series_url, long_run)
    assert len(gpu) == 2 * big and len(host) == big  # each once
    assert len({(r["device_uuid"], r["seq"]) for r in gpu}) == 2 * big
    _cli(env, "audit", "verify", "--db", pg_url, "--series", series_url)
    assert _diff(before, _figures(pg_url, env, led_.finished)) == []


def test_a_store_holding_other_rows_of_a_run_leaves_it_in_postgresql(
    pg_url: str, pg_store_url: str, tmp_path: Path
) -> None:
    led_ = _populate(pg_url, pg_store_url)
    env = _env(tmp_path, pg_store_url)
    victim = led_.finished[1]
    with Ledger(pg_url) as led:
        gpu = [{c: getattr(g, c) for c in series_tier.GPU_COLUMNS} for g in led.gpu_intervals(victim)]
    gpu[3]["energy_j"] += 1.0  # the store holds seq 3 changed (written by something else)
    store = series_tier.open_store(pg_store_url)
    try:
        store.write(victim, gpu[3:4], [], token=f"other:{uuid.uuid4()}")
    finally:
        store.close()
    out = _cli(env, "db", "migrate", "--db", pg_url, "--layout", "compact", "--series", pg_store_url, code=1)
    assert "moved and checked 3 runs" in out.stdout and "1 runs NOT moved" in out.stdout, out.output
    assert f"run {victim}: NOT moved" in out.stderr and "energy_mj" in out.stderr, out.output
    assert _raw_rows(pg_url, victim) == (N, N)  # as it was
    _cli(env, "audit", "verify", "--db", pg_url)


def test_a_run_changed_since_its_seal_stays_named(pg_url: str, pg_store_url: str, tmp_path: Path) -> None:
    """The seal is checked a page at a time; a run whose rows changed after it was sealed is not
    moved (nor laundered into a fresh seal): it stays, with the row that changed named."""
    led_ = _populate(pg_url, pg_store_url)
    env = _env(tmp_path, pg_store_url)
    victim = led_.finished[1]
    g = schema.gpu_intervals.c
    with Ledger(pg_url) as led:
        led.write(lambda conn: conn.execute(
            sa.update(schema.gpu_intervals).where(g.run_id == victim, g.seq == 7).values(energy_j=g.energy_j + 1.0)
        ))  # fmt: skip
    out = _cli(env, "db", "migrate", "--db", pg_url, "--layout", "compact", "--series", pg_store_url)
    assert "moved and checked 3 runs" in out.stdout and "2 runs kept" in out.stdout, out.output
    assert f"run {victim}: kept in PostgreSQL for now: gpu_intervals/" in out.stderr, out.output
    assert "row seq 7 edited" in out.stderr, out.output
    assert _raw_rows(pg_url, victim) == (N, N) and _stored(pg_store_url, victim) == ([], [])


def test_layout_compact_needs_a_postgresql_ledger_and_a_store(tmp_path: Path, pg_store_url: str) -> None:
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_SERIES": ""}
    db = f"sqlite:///{tmp_path}/team.db"
    _cli(env, "db", "migrate", "--db", db)
    out = _cli(env, "db", "migrate", "--db", db, "--layout", "compact", "--series", pg_store_url, code=2)
    assert "a SQLite ledger keeps its intervals as they are" in out.output, out.output
    out = _cli(env, "db", "migrate", "--db", db, "--layout", "compact", code=2)
    assert "give --series URL" in out.output, out.output
    out = _cli(env, "db", "migrate", "--db", db, "--layout", "wide", code=2)
    assert "'wide' is not 'compact'" in out.output, out.output


def test_rows_the_store_holds_already_are_not_copied_again(pg_url: str, series_url: str, tmp_path: Path) -> None:
    """Rows a ``serve --series-live`` wrote into the store in other batches (other tokens): the
    migration copies only the rest, on ClickHouse too, which has no unique key to drop them."""
    led_ = _populate(pg_url, series_url)
    env = _env(tmp_path, series_url)
    run_id = led_.finished[2]
    with Ledger(pg_url) as led:
        gpu = [{c: getattr(g, c) for c in series_tier.GPU_COLUMNS} for g in led.gpu_intervals(run_id)]
    store = series_tier.open_store(series_url)
    try:
        store.write(run_id, gpu[: N // 2], [], token=f"{run_id}:live-1")
    finally:
        store.close()
    _cli(env, "db", "migrate", "--db", pg_url, "--layout", "compact", "--series", series_url)
    with Ledger(pg_url) as led:
        (written,) = [p["written"] for p in _payloads(led, series_compact.ACTION, run_id)]
    assert written == 2 * N - N // 2 + N  # the GPU rows the store lacked, and the host's
    gpu_stored, _ = _stored(series_url, run_id)
    assert len(gpu_stored) == 2 * N == len({(r["device_uuid"], r["seq"]) for r in gpu_stored})


def _payloads(led: Ledger, action: str, run_id: str) -> list[dict[str, Any]]:
    a = schema.audit_log.c
    q = sa.select(a.payload).where(a.action == action, a.object == f"run:{run_id}")
    return [json.loads(p) for p in led.read(lambda conn: list(conn.scalars(q)))]


def test_a_late_push_of_a_moved_run_goes_to_the_store_once(pg_url: str, pg_store_url: str, tmp_path: Path) -> None:
    """After the migration a run's pushes are judged by its segments: its agent's outbox sent again
    (to ``serve --series-live``) stores nothing and changes no figure; a server without the store
    answers 503, so nothing of it lands in the ledger's raw tables."""
    from fastapi.testclient import TestClient

    from gpuledger.server.app import create_app
    from gpuledger.server.settings import Settings

    led_ = _populate(pg_url, pg_store_url)
    env = _env(tmp_path, pg_store_url)
    _cli(env, "db", "migrate", "--db", pg_url, "--layout", "compact", "--series", pg_store_url)
    before = _figures(pg_url, env, led_.finished)
    run_id = led_.finished[1]
    body = _body(MIDNIGHT + DAY_S + 3600, 1, "A", "vision")  # the run as its agent pushed it
    body["run"]["id"] = run_id
    settings = Settings(close_after_days=OPEN_DAYS, lost_after_s=0, series=pg_store_url, series_live=True)
    with TestClient(create_app(pg_url, settings=settings)) as client:
        got = client.post("/api/v1/ingest", json=body, headers=led_.agent["A"])
        assert got.status_code == 200 and got.json()["gpu_intervals"] == 0, got.text
        assert got.json()["host_intervals"] == 0 and got.json()["quarantined"] == [], got.text
    with _client(pg_url) as client:
        got = client.post("/api/v1/ingest", json=body, headers=led_.agent["A"])
        assert got.status_code == 503 and "series store only" in got.json()["detail"], got.text
    assert _raw_rows(pg_url, run_id) == (0, 0)
    assert _diff(before, _figures(pg_url, env, led_.finished)) == []
    _cli(env, "audit", "verify", "--db", pg_url, "--series", pg_store_url)


def test_a_run_whose_dropped_days_are_not_in_the_store_stays(pg_url: str, pg_store_url: str, tmp_path: Path) -> None:
    """The tiered run's first day went to another store: moving it into this one would leave that
    day out of its segments and seal, so it stays in PostgreSQL, named with the reason."""
    led_ = _populate(pg_url, pg_store_url)
    for other in tiers.store_url("postgres", tmp_path, "compact_o"):
        env = _env(tmp_path, other)
        out = _cli(env, "db", "migrate", "--db", pg_url, "--layout", "compact", "--series", other)
        assert "moved and checked 3 runs" in out.stdout and "2 runs kept" in out.stdout, out.output
        day = tiers._date(TODAY - 11)
        assert (
            f"run {led_.tiered}: kept in PostgreSQL for now: raw days {day} were dropped without a copy" in out.stderr
        )
        assert _raw_rows(pg_url, led_.tiered) == (N, N // 2)
        _cli(env, "audit", "verify", "--db", pg_url)


def test_a_run_whose_every_day_was_tiered_and_dropped_moves_too(pg_url: str, series_url: str, tmp_path: Path) -> None:
    """A run retention tiered into the store and dropped from PostgreSQL whole (no raw row left but
    its ``run.raw_tiered`` entries and frozen rollups) moves too: its rows in the store are checked
    against those entries, its segments and stream sums written from them, the run listed as
    series-only and sealed; ``audit verify`` (and ``--series``) pass and every figure stays."""
    led_ = _populate(pg_url, series_url, gone=True)
    assert led_.gone is not None
    gone = led_.gone["run"]["id"]
    env = _env(tmp_path, series_url)
    runs = [gone, *led_.finished]
    assert _raw_rows(pg_url, gone) == (0, 0) and _stored(series_url, gone) == _quantized(led_.gone)
    verify = ["audit", "verify", "--db", pg_url]
    before = _figures(pg_url, env, runs)
    migrate = ["db", "migrate", "--db", pg_url, "--layout", "compact", "--series", series_url]

    out = _cli(env, *migrate)
    assert "moved and checked 5 runs" in out.stdout and "1 runs kept" in out.stdout, out.output
    assert f"run {gone}: moved and checked 0 rows and {3 * N} rows of its dropped days the store held" in out.stderr
    _cli(env, *verify)
    checked = _cli(env, *verify, "--series", series_url)
    assert "5 series-only runs checked" in checked.output, checked.output
    assert _diff(before, _figures(pg_url, env, runs)) == []
    with Ledger(pg_url) as led:
        assert led.read(lambda conn: series_segments.is_marked(conn, gone))
        spans = led.read(lambda conn: series_segments.segments(conn, gone))
        streams = led.read(lambda conn: series_streams.read(conn, [gone]))
        seal = led.read(lambda conn: series_segments.latest_seal(conn, gone))
    gpu, host = _quantized(led_.gone)
    uuids = sorted({r["device_uuid"] for r in gpu})
    assert {k: [(s.first_seq, s.last_seq) for s in v] for k, v in spans.items()} == {
        **{u: [(0, N - 1)] for u in [*uuids, ""]}
    }
    assert seal is not None and (seal["gpu_rows"], seal["host_rows"]) == (2 * N, N)
    cols = ("device_uuid", "seq", "throttle_s", *series_streams.GAUGES)
    want = series_streams.stream_rows(gone, [[r[c] for c in cols] for r in gpu], cols,
                                      [[r["seq"], r["cpu_s"]] for r in host], ("seq", "cpu_s"))  # fmt: skip
    assert {(gone, w["device_uuid"]): {k: streams[(gone, w["device_uuid"])][k] for k in w} for w in want} == {
        (gone, w["device_uuid"]): w for w in want
    }
    again = _cli(env, *migrate)
    assert "5 runs compact already" in again.stdout, again.output

    # Once the store drops its days, the run's are named expired (each of them), never missing.
    assert tiers.expire_store_days(pg_url, series_url, 10, time.time()) >= 2
    checked = _cli(env, *verify, "--series", series_url)
    assert "TAMPERED" not in checked.output and "missing" not in checked.output, checked.output
    shown = _cli(env, "show", gone, "--db", pg_url)
    days = f"{tiers._date(TODAY - 12)} to {tiers._date(TODAY - 11)}"
    assert f"raw curves of 2 days ({days}) expired from the series store" in shown.output, shown.output


class _Watched:
    """The real store, noting the rows of each write and any read of a whole run."""

    def __init__(self, store: Any) -> None:
        self.store, self.writes, self.whole_reads = store, [], []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def write(self, run_id: str, gpu: Any, host: Any, token: str) -> int:
        self.writes.append(len(gpu) + len(host))
        return int(self.store.write(run_id, gpu, host, token=token))

    def gpu_intervals(self, *args: Any) -> Any:
        self.whole_reads.append("gpu_intervals")
        return self.store.gpu_intervals(*args)

    def host_intervals(self, *args: Any) -> Any:
        self.whole_reads.append("host_intervals")
        return self.store.host_intervals(*args)


def _run_rows_bytes(led: Ledger, run_id: str) -> int:
    """The Python memory a run's ledger rows take held whole, as dicts (as the migration held them)."""
    g, h = schema.gpu_intervals, schema.host_intervals

    def read(conn: sa.Connection) -> int:
        tracemalloc.start()
        try:
            rows = [dict(r) for r in conn.execute(sa.select(g).where(g.c.run_id == run_id)).mappings()]
            rows += [dict(r) for r in conn.execute(sa.select(h).where(h.c.run_id == run_id)).mappings()]
            return tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
            del rows

    return led.read(read)


def test_a_long_run_is_moved_a_page_at_a_time(pg_url: str, series_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The migration holds a few pages of a run, never the whole: with pages of 250 rows, a run of
    2 GPUs x 3,000 intervals and its host's 3,000 is read from the ledger (its seal checked too)
    and from the store, and written into the store, 250 rows at most at a time, never by a read
    of the whole run; the Python memory the migration takes at its peak is a small part of what
    the run's rows take held whole."""
    big, page = 3000, 250
    led_ = _populate(pg_url, series_url, big=big)
    long_run = led_.finished[2]
    monkeypatch.setattr(series_compact, "BATCH_ROWS", page)
    read: dict[str, list[int]] = {}

    def counted(name: str, pages: Any) -> Any:
        def each(*args: Any, **kwargs: Any) -> Any:
            for rows in pages(*args, **kwargs):
                read.setdefault(name, []).append(len(rows))
                yield rows

        return each

    for name in ("ledger_gpu_pages", "ledger_host_pages", "store_gpu_pages", "store_host_pages"):
        monkeypatch.setattr(series_compact_read, name, counted(name, getattr(series_compact_read, name)))
    tier = series_tier.Tier.open(series_url)
    try:
        with Ledger(pg_url) as led:
            whole = _run_rows_bytes(led, long_run)
            watched = _Watched(tier.store)
            paged = series_tier.Tier(watched, tier.url)  # type: ignore[arg-type]
            tracemalloc.start()
            try:
                done = series_compact.compact(led, paged, actor="test", tampered=_tampered)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert sorted(done.moved) == sorted(led_.finished) and not done.failed, done
            assert audit.verify(led, close_after_days=OPEN_DAYS).ok
    finally:
        tier.store.close()
    assert watched.whole_reads == []
    assert max(watched.writes) == page and sum(watched.writes) == (N + N // 2) + 2 * N + 3 * big + 2 * N
    assert set(read) == {"ledger_gpu_pages", "ledger_host_pages", "store_gpu_pages", "store_host_pages"}
    assert all(max(sizes) == page for sizes in read.values()), read
    assert peak < whole / 3, (peak, whole)  # a few pages and fixed costs (4.3 MB at pages of 500, any run)
    gpu, host = _stored(series_url, long_run)
    assert len(gpu) == 2 * big and len(host) == big


def test_a_moved_run_stays_verifiable_once_the_store_drops_its_first_days(
    pg_url: str, series_url: str, tmp_path: Path
) -> None:
    """The seal the migration records keeps per-day summaries, as a series-only push's does: once
    the store's window drops a moved run's early days, `audit verify --series` names them expired
    and still checks the days kept against the seal, not against the day sums alone."""
    led_ = _populate(pg_url, series_url, big=N // 2)
    env = _env(tmp_path, series_url)
    _cli(env, "db", "migrate", "--db", pg_url, "--layout", "compact", "--series", series_url)
    assert tiers.expire_store_days(pg_url, series_url, 10, time.time()) >= 1  # drops TODAY-11 and TODAY-10
    gpu, _host = _stored(series_url, led_.tiered)
    assert gpu == []  # the run across MIDNIGHT is gone from the store whole
    assert _stored(series_url, led_.finished[1])[0] != []  # the next day's run is kept

    checked = _cli(env, "audit", "verify", "--db", pg_url, "--series", series_url)
    assert "TAMPERED" not in checked.output and "missing" not in checked.output, checked.output
    assert "series-only run days" in checked.output and "expired from the series store" in checked.output
    assert "sealed before the seal kept per-day summaries" not in checked.output, checked.output
