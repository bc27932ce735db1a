"""A series-only run's rollups (store/series_day_sums.py) equal those of the same rows kept in the
ledger: generated pushes (intervals crossing one or several midnights, gaps, unmeasured busy or
energy), regrouped and resent, through the in-process server in ``--series-only`` mode, against
one push of the same rows to a plain server; then ``materialise_rollups`` writes both runs'
``gpu_rollups`` and they are compared row by row.
"""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_series_tier as tiers
from gpuledger.reports.cost import usage
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, schema, series_tier
from gpuledger.store import cost_queries as cq
from gpuledger.store.retention import DAY_S
from server_support import bearer, devices_doc, run_doc, setup_accounts
from test_pg_partitions import OPEN_DAYS, TODAY

pytestmark = pytest.mark.postgres

pg_url = tiers.pg_url
MIDNIGHT = (TODAY - 30) * DAY_S  # 12 intervals of up to 194,000 s end 3 days ago at the latest


@pytest.fixture
def pg_store_url(tmp_path: Path) -> Iterator[str]:
    for url in tiers.store_url("postgres", tmp_path, "only_r"):
        series_tier.open_store(url, create=True).close()  # serve makes its tables at start
        yield url


# one interval: (gap before it, length, busy share or None, watts or None), seconds
_interval = st.tuples(
    st.sampled_from([0.0, 0.0, 0.0, 3.0, 4000.0]),
    st.sampled_from([0.0, 5.0, 7.5, 60.0, 3600.0, 90000.0, 190000.0]),
    st.one_of(st.none(), st.floats(0.0, 1.0)),
    st.one_of(st.none(), st.floats(0.0, 300.0)),
)


def _rows(device: str, intervals: list[tuple[float, float, float | None, float | None]], start: float) -> list[dict]:  # type: ignore[type-arg]
    out, t = [], start
    for seq, (gap, length, busy, watts) in enumerate(intervals):
        t0 = t + gap
        t = t0 + length
        out.append({
            "device_uuid": device, "seq": seq, "t0": t0, "t1": t, "samples": 5,
            "busy_s": None if busy is None else busy * length, "util_method": "samples",
            "energy_j": None if watts is None else watts * length, "energy_method": "counter",
        })  # fmt: skip
    return out


def _body(run_id: str, gpus: list[str], rows: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
    start = min(r["t0"] for r in rows)
    end = max(r["t1"] for r in rows)
    fields = {"status": "succeeded", "ended_at": end + 1.0, "exit_code": 0} if final else {"status": "running"}
    model = devices_doc(1)[0]
    return {
        "run": run_doc(run_id, started_at=start - 1.0, **fields),
        "devices": [{**model, "index": i, "uuid": u} for i, u in enumerate(gpus)],
        "gpu_intervals": rows,
        "host_intervals": [],
        "final": final,
    }


def _rollups(led: Ledger, run_id: str) -> list[dict[str, Any]]:
    t = schema.gpu_rollups

    def read(conn: sa.Connection) -> list[dict[str, Any]]:
        q = sa.select(t).where(t.c.run_id == run_id).order_by(t.c.day, t.c.gpu_name, t.c.measured)
        return [{k: v for k, v in r.items() if k != "run_id"} for r in conn.execute(q).mappings()]

    return led.read(read)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.lists(_interval, min_size=1, max_size=12), min_size=1, max_size=2),
    st.floats(-200000.0, 2000.0),
    st.lists(st.integers(0, 30), max_size=4),
    st.randoms(use_true_random=False),
)
def test_series_only_rollups_equal_those_of_the_same_rows_in_the_ledger(
    pg_url: str, pg_store_url: str, per_gpu: list[list[Any]], offset: float, cuts: list[int], rnd: Any
) -> None:
    token = _token(pg_url)
    # GPUs of their own in each example (the ledger is shared by the examples): no co-tenant
    fresh = uuid.uuid4().hex[:8]
    plain_gpus, only_gpus = [f"GPU-p{d}-{fresh}" for d in range(2)], [f"GPU-o{d}-{fresh}" for d in range(2)]
    start = MIDNIGHT + offset
    plain_rows = [r for d, ivs in enumerate(per_gpu) for r in _rows(plain_gpus[d], ivs, start)]
    only_rows = [{**r, "device_uuid": only_gpus[plain_gpus.index(r["device_uuid"])]} for r in plain_rows]
    plain_id, only_id = str(uuid.uuid4()), str(uuid.uuid4())
    plain = TestClient(create_app(pg_url, settings=Settings(close_after_days=OPEN_DAYS, lost_after_s=0)))
    only = TestClient(
        create_app(
            pg_url,
            settings=Settings(close_after_days=OPEN_DAYS, lost_after_s=0, series=pg_store_url, series_only=True),
        )
    )
    with plain, only:
        got = plain.post("/api/v1/ingest", json=_body(plain_id, plain_gpus, plain_rows, final=True), headers=token)
        assert got.status_code == 200 and got.json()["quarantined"] == [], got.text
        # the same rows in batches cut at ``cuts``, in any order but the last, each sent twice, one earlier
        # batch resent with a later one
        order = sorted(only_rows, key=lambda r: (r["seq"], r["device_uuid"]))
        edges = sorted({0, len(order), *(min(c, len(order)) for c in cuts)})
        batches = [order[a:b] for a, b in itertools.pairwise(edges) if b > a]
        head = batches[:-1]
        rnd.shuffle(head)  # out of seq order: a gap filled by a later push
        batches = [*head, batches[-1]]
        for n, rows in enumerate(batches):
            last = n == len(batches) - 1
            sent = [*rows, *(rnd.choice(batches[:n]) if n else [])]
            for _ in range(2):
                body = _body(only_id, only_gpus, copy.deepcopy(sent), final=last)
                body["run"]["started_at"] = min(r["t0"] for r in only_rows) - 1.0
                if last:
                    body["run"]["ended_at"] = max(r["t1"] for r in only_rows) + 1.0
                got = only.post("/api/v1/ingest", json=body, headers=token)
                assert got.status_code == 200 and got.json()["quarantined"] == [], got.text
    with Ledger(pg_url) as led:
        assert led.gpu_intervals(only_id) == [] and len(led.gpu_intervals(plain_id)) == len(plain_rows)
        renamed = dict(zip(plain_gpus, only_gpus, strict=True))
        assert led.read(lambda conn: _day_sums(conn, only_id)) == led.read(
            lambda conn: {(renamed[u], k): v for (u, k), v in _reference_sums(conn, plain_id).items()}
        )
        ends = led.read(lambda conn: cq.last_interval_ends(conn, [plain_id, only_id]))
        assert ends[only_id] == ends[plain_id]  # a windowed report's end of a run without one
        materialise_rollups(led)
        want, got_rows = _rollups(led, plain_id), _rollups(led, only_id)
    assert len(got_rows) == len(want) and want
    for a, b in zip(want, got_rows, strict=True):
        assert b == {k: pytest.approx(v, rel=1e-9, abs=1e-6) if isinstance(v, float) else v for k, v in a.items()}


SUMS = ("t0", "t1", "busy_s", "busy_n", "energy_j", "energy_n", "intervals")


def _reference_sums(conn: sa.Connection, run_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    """What cost queries sum from a run's raw rows per (GPU, day): ``interval_sums``' day rows,
    its raw rows (intervals across several midnights) added as ``interval_day_usage`` adds them."""
    days, raw = cq.interval_sums(conn, [run_id], None, None)
    per: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    for d in days:
        per.setdefault(d["device_uuid"], {})[(d["day"], 0)] = {k: d[k] for k in SUMS}
    for iv in raw:
        usage._add_raw(per.setdefault(iv["device_uuid"], {}), iv, [])
    return {(u, day): _approx(row) for u, rows in per.items() for (day, _), row in rows.items()}


def _day_sums(conn: sa.Connection, run_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    t = schema.series_day_sums
    rows = conn.execute(sa.select(t).where(t.c.run_id == run_id)).mappings()
    return {(r["device_uuid"], r["day"]): {k: r[k] for k in SUMS} for r in rows}


def _approx(row: dict[str, Any]) -> dict[str, Any]:
    return {k: pytest.approx(v, rel=1e-9, abs=1e-6) if isinstance(v, float) else v for k, v in row.items()}


_TOKENS: dict[str, dict[str, str]] = {}


def _token(pg_url: str) -> dict[str, str]:
    """The agent's token of this ledger (one ledger per test, many examples)."""
    if pg_url not in _TOKENS:
        _TOKENS[pg_url] = bearer(setup_accounts(pg_url).agent_a)
    return _TOKENS[pg_url]
