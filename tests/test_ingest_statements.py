"""A push's cost in statements and transactions (issue 38: the team server's CPU per push).

A steady push of a run (its next minute of every GPU) is one write transaction whose statements
do not grow with the run's GPUs: the timeline check reads every series' stored neighbours in one
statement (store/series_rules.py), the bulk insert reuses what it read, the rollup marks come with
the run's row lock, the liveness note and a swept run's revival ride in the push's transaction.
And what each of those saves must still be right: overlaps refused per GPU, resent rows stored
once, a revived run revived, a rolled-up run's replay dropped (test_retention.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, schema
from gpuledger.store.series_tier import open_store
from server_support import (
    BACKENDS,
    backend_url,
    batch,
    bearer,
    devices_doc,
    fresh_pg_url,
    gpu_rows,
    host_rows,
    run_doc,
    setup_accounts,
)
from test_series_tier import store_url


class Counter:
    """Statements (as the driver gets them) and transactions begun on a ledger's engine."""

    def __init__(self, engine: sa.Engine) -> None:
        self.statements: list[str] = []
        self.begins = 0
        sa.event.listen(engine, "before_cursor_execute", self._statement)
        sa.event.listen(engine, "begin", self._begin)

    def _statement(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.lstrip().upper().startswith("BEGIN"):  # SQLite's BEGIN IMMEDIATE is a transaction
            self.statements.append(statement)

    def _begin(self, _conn: Any) -> None:
        self.begins += 1

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter]:
        self.statements, self.begins = [], 0
        yield self


@pytest.fixture(params=BACKENDS)
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TestClient, str, str, Counter]]:
    with backend_url(request.param, tmp_path) as url:
        tokens = setup_accounts(url)
        app = create_app(url, settings=Settings(lost_after_s=0, token_cache_s=60))
        with TestClient(app) as client:
            yield client, url, tokens.agent_a, Counter(app.state.ledger.database.engine)


def _minute(run: dict[str, Any], gpus: int, minute: int) -> dict[str, Any]:
    """The run's ``minute``-th minute: 12 rows of 5 s per GPU and of the host."""
    first = 12 * minute
    return {
        "run": run, "devices": devices_doc(gpus, run["host"]),
        "gpu_intervals": gpu_rows(12, gpus, first_seq=first, host=run["host"]),
        "host_intervals": host_rows(12, first_seq=first),
    }  # fmt: skip


def _push(client: TestClient, token: str, body: dict[str, Any]) -> dict[str, Any]:
    got = client.post("/api/v1/ingest", json=body, headers=bearer(token))
    assert got.status_code == 200, got.text
    return dict(got.json())


def _steady_push(client: TestClient, token: str, counter: Counter, gpus: int) -> Counter:
    """A run's second minute pushed, counted (the first created it)."""
    run = run_doc()
    _push(client, token, _minute(run, gpus, 0))
    with counter.counting() as counted:
        out = _push(client, token, _minute(run, gpus, 1))
    assert (out["gpu_intervals"], out["host_intervals"], out["quarantined"]) == (12 * gpus, 12, [])
    return counted


def test_a_steady_push_costs_the_same_statements_for_8_gpus_as_for_1(api) -> None:  # type: ignore[no-untyped-def]
    client, url, token, counter = api
    one = _steady_push(client, token, counter, 1)
    eight = _steady_push(client, token, counter, 8)
    assert len(eight.statements) == len(one.statements), "\n".join(eight.statements)
    # the token's check (revocation, on every use), then the push: lock, owner, devices, the
    # timeline's neighbours of the GPUs and of the host, the rows (PostgreSQL: COPY, unseen here;
    # SQLite: an insert, with the run's rows counted before and after, per series), the liveness note
    sqlite = url.startswith("sqlite")
    assert len(eight.statements) <= (12 if sqlite else 7), "\n".join(eight.statements)
    near = [s for s in eight.statements if "FROM gpu_intervals" in s and "UNION ALL" in s]
    assert len(near) == 1, eight.statements  # one read for all 8 GPUs


def test_a_push_is_one_write_transaction(api) -> None:  # type: ignore[no-untyped-def]
    client, _url, token, counter = api
    counted = _steady_push(client, token, counter, 8)
    # the token's check and the push: no transaction of its own for the liveness note or the revival
    assert counted.begins == 2


def test_overlaps_are_refused_per_gpu_in_one_read(api) -> None:  # type: ignore[no-untyped-def]
    """Three GPUs checked in one statement: each one's rows against its own neighbours only."""
    client, url, token, _counter = api
    run = run_doc()
    _push(client, token, _minute(run, 3, 0))  # seqs 0-11 of GPU-0..2, 5 s each
    rows = gpu_rows(12, 3, first_seq=12)
    g0 = [r for r in rows if r["device_uuid"] == "GPU-0"]
    g1 = [r for r in rows if r["device_uuid"] == "GPU-1"]
    g2 = [r for r in rows if r["device_uuid"] == "GPU-2"]
    g0[0] = g0[0] | {"t0": g0[0]["t0"] - 2.5}  # starts before GPU-0's stored seq 11 ends
    g1 = gpu_rows(6, 3, first_seq=6)[6:12]  # GPU-1's seqs 6-11 sent again, as stored
    g2[-1] = g2[-1] | {"t1": g2[-1]["t1"] + 1.0}  # seq 23 ends after seq 24 of the same push starts...
    g2.append(gpu_rows(1, 3, first_seq=24)[2])
    body = {"run": run, "devices": devices_doc(3, run["host"]), "gpu_intervals": [*g0, *g1, *g2]}
    out = _push(client, token, body)
    refused = sorted(q["item"] for q in out["quarantined"])
    assert refused == ["GPU-0 seq 12", "GPU-2 seq 24"]  # ...which is refused, seq 23 kept
    assert out["gpu_intervals"] == 11 + 0 + 12
    with Ledger(url) as led:
        got = {(iv.device_uuid, iv.seq) for iv in led.gpu_intervals(run["id"])}
    assert len(got) == 12 * 3 + 23
    assert ("GPU-0", 12) not in got and ("GPU-2", 24) not in got and ("GPU-2", 23) in got


def test_a_resent_minute_with_the_next_one_is_stored_once(api) -> None:  # type: ignore[no-untyped-def]
    """An agent's outbox after a failure: the unacknowledged minute again with the next one, both
    GPUs, in one push; the bulk insert keeps out what the timeline check found stored."""
    client, url, token, _counter = api
    run = run_doc()
    _push(client, token, _minute(run, 2, 0))
    _push(client, token, _minute(run, 2, 1))
    both = _minute(run, 2, 1)
    later = _minute(run, 2, 2)
    body = both | {"gpu_intervals": both["gpu_intervals"] + later["gpu_intervals"],
                   "host_intervals": both["host_intervals"] + later["host_intervals"]}  # fmt: skip
    out = _push(client, token, body)
    assert (out["gpu_intervals"], out["host_intervals"], out["quarantined"]) == (24, 12, [])
    with Ledger(url) as led:
        gpu = [(iv.device_uuid, iv.seq) for iv in led.gpu_intervals(run["id"])]
        host = [iv.seq for iv in led.host_intervals(run["id"])]
    assert len(gpu) == len(set(gpu)) == 72 and sorted(host) == list(range(36))


def test_the_push_notes_the_run_alive(api) -> None:  # type: ignore[no-untyped-def]
    client, url, token, _counter = api
    run = run_doc()
    _push(client, token, batch(run, n=3))
    with Ledger(url) as led:
        noted = led.read(
            lambda c: c.scalar(
                sa.select(schema.run_liveness.c.last_push_at).where(schema.run_liveness.c.run_id == run["id"])
            )
        )
    assert noted is not None


@pytest.fixture
def only_api(tmp_path: Path) -> Iterator[tuple[TestClient, str, str, Counter]]:
    """``serve --series-only`` in-process on PostgreSQL, into the compact PostgreSQL store."""
    with fresh_pg_url() as url:
        for series in store_url("postgres", tmp_path, "stmts_t"):
            open_store(series).close()  # as serve makes it, before its workers start
            tokens = setup_accounts(url)
            settings = Settings(lost_after_s=0, token_cache_s=60, series=series, series_only=True)
            app = create_app(url, settings=settings)
            with TestClient(app) as client:
                yield client, url, tokens.agent_a, Counter(app.state.ledger.database.engine)


@pytest.mark.postgres
def test_a_steady_series_only_push_costs_the_same_statements_for_8_gpus_as_for_1(only_api) -> None:  # type: ignore[no-untyped-def]
    client, _url, token, counter = only_api
    one = _steady_push(client, token, counter, 1)
    eight = _steady_push(client, token, counter, 8)
    assert len(eight.statements) == len(one.statements), "\n".join(eight.statements)
    # the token's check; lock, owner, devices, the segments of every stream (read once, for the
    # checks and the record), the grown segments (one executemany for the GPUs and the host), the
    # day sums, the streams, the liveness note
    assert len(eight.statements) <= 9, "\n".join(eight.statements)
    assert sum("FROM series_segments" in s for s in eight.statements) == 1, eight.statements
    assert eight.begins == 2
