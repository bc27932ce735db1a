"""The server's ``/runs/{id}/intervals`` pages of a run whose raw days were tiered into a series
store (``serve --series``; store/server_queries.tiered_interval_rows): each page is the whole run's
rows after ``after_t``, cut at ``limit``, so pages concatenate to the whole run; and from a store
that reads a time window (both: the compact PostgreSQL store and ClickHouse) a page reads growing
windows from ``after_t``, not the whole run. Both with the days dropped from PostgreSQL and with one
day still held there too (the ledger's copy wins). On the real PostgreSQL server, into the compact
PostgreSQL store and ClickHouse on chDB.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import test_series_tier as tiers
from gpuledger.store import Ledger, series_tier, server_queries
from gpuledger.store.retention import DAY_S
from test_series_tier_reads import _drop, _half_dropped

pytestmark = pytest.mark.postgres

pg_url, series_url = tiers.pg_url, tiers.series_url
N = tiers.N  # 5 s rows per GPU (2) and for the host, 150 s either side of a midnight


class _Counted:
    """The real store, the rows each of its reads returned counted by method."""

    def __init__(self, store: Any) -> None:
        self.store, self.rows = store, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if not name.startswith(("gpu_intervals", "host_intervals")):
            return found

        def counted(*args: Any) -> Any:
            out = found(*args)
            self.rows[name] += len(out)
            return out

        return counted


def _rows(led: Ledger, run_id: str, series: str, after_t: float | None = None, limit: int | None = None) -> list:  # type: ignore[type-arg]
    return list(server_queries.tiered_interval_rows(led, run_id, series=(series,), after_t=after_t, limit=limit))


def _key(row: dict[str, Any]) -> tuple[str, str, int]:
    return (row["series"], row["gpu_uuid"] or "", row["seq"])


@pytest.mark.parametrize("drop", [_drop, _half_dropped], ids=["dropped", "half-held"])
def test_every_page_is_the_whole_runs_rows_after_after_t_cut_at_limit(
    pg_url: str, series_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, drop: Callable[..., None]
) -> None:
    run_id, _, _ = tiers._ingested(pg_url)
    drop(pg_url, series_url, *([tmp_path] if drop is _half_dropped else []))
    monkeypatch.setattr(server_queries, "FIRST_WINDOW_S", 7.0)  # windows of 7, 28, 112 ... s: several a page
    store = series_tier.open_store(series_url, create=False)
    try:
        with Ledger(pg_url, series=store) as led:
            assert led.tiered(run_id)
            for series in ("gpu", "host"):
                whole = _rows(led, run_id, series)
                assert len(whole) == (2 if series == "gpu" else 1) * N
                midnight = (tiers.TODAY - 10) * DAY_S
                edges = [None, whole[0]["t0"], midnight, midnight - 0.001, whole[N // 3]["t1"], whole[-1]["t1"]]
                for after_t in [*edges, whole[-1]["t1"] - 1e-3, whole[0]["t0"] - 3 * DAY_S]:
                    later = [r for r in whole if after_t is None or r["t1"] > after_t]
                    for limit in (1, 7, 25, 10_000):
                        assert _rows(led, run_id, series, after_t, limit) == later[:limit], (series, after_t, limit)
                # paged as docs/SERVER.md says: after_t just below the last row's t1, the overlap dropped by key
                got: dict[tuple[str, str, int], dict[str, Any]] = {}
                after: float | None = None
                while True:
                    page = _rows(led, run_id, series, after, 25)
                    new = [r for r in page if _key(r) not in got]
                    got.update((_key(r), r) for r in page)
                    if len(page) < 25 or not new:
                        break
                    after = page[-1]["t1"] - 1e-3
                assert sorted(got.values(), key=_key) == sorted(whole, key=_key)
    finally:
        store.close()


@pytest.mark.parametrize("kind", tiers.KINDS)
def test_a_page_reads_the_windows_after_after_t_not_the_whole_run(
    pg_url: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From either store a page of 5 rows from the middle of the run reads a window of 20 s (4 rows
    per stream), and a longer page a next window sized for the rows it still wants; never the
    whole run."""
    run_id, _, _ = tiers._ingested(pg_url)
    for url in tiers.store_url(kind, tmp_path, "tier_pages"):
        _drop(pg_url, url)
        monkeypatch.setattr(server_queries, "FIRST_WINDOW_S", 20.0)
        store = _Counted(series_tier.open_store(url, create=False))
        try:
            with Ledger(pg_url, series=store) as led:  # type: ignore[arg-type]
                assert led.series_reads is not None and led.series_reads.windowed
                middle = (tiers.TODAY - 10) * DAY_S - 42.0
                gpu, host = _rows(led, run_id, "gpu", middle, 5), _rows(led, run_id, "host", middle, 5)
                assert [r["t1"] > middle for r in gpu + host] == [True] * 10
                assert store.rows["gpu_intervals"] == store.rows["host_intervals"] == 0
                assert 5 <= store.rows["gpu_intervals_between"] <= 2 * 5  # 2 GPUs, at most 5 rows each in 20 s
                assert 5 <= store.rows["host_intervals_between"] <= 5
                store.rows.clear()
                # 60 GPU rows from the start: 8 in the first 20 s, then a window for about the 52 left
                assert len(_rows(led, run_id, "gpu", None, 60)) == 60
                assert 60 <= store.rows["gpu_intervals_between"] <= 1.3 * 60 + 8, store.rows
                store.rows.clear()
                assert len(_rows(led, run_id, "gpu")) == 2 * N  # no limit: read whole, as before
                assert store.rows["gpu_intervals"] == 2 * N and not store.rows["gpu_intervals_between"]
        finally:
            store.store.close()


def _fractional(run_id: str) -> dict[str, Any]:
    """A second run on the same days whose times are finer than the store's unit: each interval's
    quantized t1 (the store's copy) is after the ledger's; and one GPU interval of no length."""
    body = tiers._body((tiers.TODAY - 10) * DAY_S - N / 2 * 5.0)
    body["run"]["id"] = run_id
    for r in body["gpu_intervals"] + body["host_intervals"]:
        r["t0"], r["t1"] = r["t0"] + 0.0003, r["t1"] - 0.0004
    body["gpu_intervals"][N - 1]["t1"] = body["gpu_intervals"][N - 1]["t0"]  # GPU-0's last, on the second day
    return body


def test_the_ledgers_copy_wins_and_no_row_is_missed_at_a_windows_edge(
    pg_url: str, series_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the second day held in both stores, a page after a held row's own t1 leaves that row out
    (the store's copy, which ends later, is not given instead); and an interval of no length on the
    boundary between two windows is in the page."""
    run_id = "f4ac7104-0000-4000-8000-000000000001"
    tiers._ingested(pg_url, 2, _fractional(run_id))
    _half_dropped(pg_url, series_url, tmp_path)
    monkeypatch.setattr(server_queries, "FIRST_WINDOW_S", 7.0)
    midnight = (tiers.TODAY - 10) * DAY_S
    store = series_tier.open_store(series_url, create=False)
    try:
        with Ledger(pg_url, series=store) as led:
            for series in ("gpu", "host"):
                whole = _rows(led, run_id, series)
                held = [r for r in whole if r["t0"] > midnight]
                assert held and all(r["t1"] % 1 for r in held if r["t1"] > r["t0"])  # the ledger's own times
                for r in held[:: N // 6]:
                    later = [x for x in whole if x["t1"] > r["t1"]]
                    assert _rows(led, run_id, series, r["t1"], 10) == later[:10], (series, r)
            gpu = _rows(led, run_id, "gpu")
            nothing = next(r for r in gpu if r["t1"] == r["t0"])
            after = nothing["t0"] - 7.0  # the first window ends where it starts and ends
            assert _rows(led, run_id, "gpu", after, 1000) == [r for r in gpu if r["t1"] > after]
    finally:
        store.close()
