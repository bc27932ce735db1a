"""What ``db migrate --layout compact`` sums a page at a time (store/series_compact*.py) equals what
the same rows give held whole, to the last bit and hash: the store's summaries (series_tier), the
seal of a series (core/audit/seal.py) and the day sums (series_day_sums); and both stores' pages."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

import test_series_tier as tiers
from gpuledger.core.audit import seal as seals
from gpuledger.store import series_compact_read, series_day_sums, series_tier
from gpuledger.store.series_compact_seal import SeriesSeal
from server_support import gpu_rows, host_rows

series_url = tiers.series_url
NOW = time.time() - 3600  # inside the stores' raw window


def _rows(n: int, seed: int) -> list[dict[str, Any]]:
    """GPU rows in seq order, with gaps, unmeasured columns and sums whose float order matters."""
    rnd = random.Random(seed)
    out, t, seq = [], 1_700_000_000.0 - 3 * 3600, 0
    for _ in range(n):
        seq += rnd.choice((1, 1, 1, 2, 7))
        length = rnd.uniform(0.1, 1800.0)  # some cross a midnight
        busy = rnd.uniform(0, length) * 1e-3 ** rnd.randint(0, 2)  # magnitudes apart: the order of a float sum shows
        out.append({
            "device_uuid": rnd.choice(("GPU-a", "GPU-b")), "seq": seq, "t0": t, "t1": t + length,
            "samples": rnd.randint(1, 60), "busy_s": None if rnd.random() < 0.1 else busy,
            "energy_j": None if rnd.random() < 0.1 else rnd.uniform(0, 1e6), "util_method": "nvml",
            "throttle_s": {"power": rnd.uniform(0, 5)},
        })  # fmt: skip
        t += length + rnd.uniform(0, 60)
    return out


def _pages(rows: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


@pytest.mark.parametrize(("n", "size"), [(0, 7), (1, 7), (1300, 1), (1300, 97), (1300, 5000)])
def test_a_series_sealed_a_page_at_a_time_is_sealed_as_held_whole(n: int, size: int) -> None:
    rows = [r for r in _rows(n, seed=n + size) if r["device_uuid"] == "GPU-a"]
    paged = SeriesSeal(len(rows), seals.GPU_SUMS, "gpu_intervals")
    for page in _pages(rows, size):
        paged.add(page)
    assert paged.result() == seals.seal_series(rows, seals.GPU_SUMS)


@pytest.mark.parametrize("size", [1, 13, 10_000])
def test_the_store_summary_and_day_sums_of_pages_are_those_of_the_whole(size: int) -> None:
    rows = _rows(1500, seed=size)
    quantized = [series_tier.quantum.quantize_gpu(r) for r in rows]
    paged = series_tier.Summing(series_tier.GPU_SUMS, series_tier.GPU_COLUMNS)
    for page in _pages(quantized, size):
        paged.add(page)
    assert paged.result() == series_tier.summary(quantized, series_tier.GPU_SUMS, series_tier.GPU_COLUMNS)

    cols = ("device_uuid", "t0", "t1", "busy_s", "energy_j")
    values = [[r[c] for c in cols] for r in rows]
    sums: series_day_sums.DaySums = {}
    for page in _pages(values, size):  # type: ignore[arg-type]
        series_day_sums.fold(sums, "run", page, cols)
    whole = series_day_sums.day_rows("run", values, cols)
    assert list(sums.values()) == whole and len(whole) > 2  # equal floats, not approximately


def _store_rows(n: int) -> list[dict[str, Any]]:
    return [{c: r.get(c) for c in series_tier.GPU_COLUMNS} for r in gpu_rows(n, devices=2, start=NOW)]


@pytest.mark.postgres
def test_a_store_reads_a_run_a_page_at_a_time(series_url: str) -> None:
    """``gpu_page`` / ``host_page`` of both stores: rows after a seq in seq order, ``limit`` a page
    and those tied with its last seq (ClickHouse may hold a row twice: never split between pages);
    paged through, a run's rows are those ``gpu_intervals`` reads whole."""
    store = series_tier.open_store(series_url)
    try:
        gpu = _store_rows(10)
        host = [{c: r.get(c) for c in series_tier.HOST_COLUMNS} for r in host_rows(10, start=NOW)]
        store.write("r1", gpu, host, token="one")
        store.write("r2", _store_rows(4), [], token="other run")
        twice = [r for r in gpu if r["seq"] == 2 and r["device_uuid"].endswith("-0")]
        store.write("r1", twice, [], token="again")  # ClickHouse keeps it twice; PostgreSQL by its key once
        uuids = store.gpu_devices("r1")
        assert uuids == sorted({r["device_uuid"] for r in gpu}) and store.gpu_devices("none") == []
        whole = store.gpu_intervals("r1")
        assert len(whole) in (20, 21)
        paged = [
            r for uuid in uuids for page in series_compact_read.store_gpu_pages(store, "r1", uuid, 3) for r in page
        ]
        assert paged == whole
        first = store.gpu_page("r1", uuids[0], -1, 3)
        assert [r["seq"] for r in first] == ([0, 1, 2, 2] if len(whole) == 21 else [0, 1, 2])
        assert [r["seq"] for r in store.gpu_page("r1", uuids[0], 2, 3)] == [3, 4, 5]
        assert [r["seq"] for r in store.host_page("r1", 7, 5)] == [8, 9]
        pages = list(series_compact_read.store_host_pages(store, "r1", 4, after=1, upto=6))
        assert [[r["seq"] for r in p] for p in pages] == [[2, 3, 4, 5], [6]]
        assert [r for p in pages for r in p] == store.host_intervals("r1")[2:7]
    finally:
        store.close()
