"""open_series(url): the series store a URL names (docs/SCALE.md, section 3), on the real engines:
chDB in-process, the PostgreSQL test server; anything else is a clear error that names the shapes
and never the password."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from ci_support import need_module
from conftest import PG_URL
from gpuledger.series.open import BadSeriesUrl, open_series

ROW = {  # a full ledger gpu_intervals row (without run_id)
    "device_uuid": "GPU-open-1", "seq": 0, "t0": 1_700_000_000.0, "t1": 1_700_000_005.0, "samples": 30,
    "busy_s": 2.5, "util_method": "samples", "util_max_pct": 97.0, "util_idle_s": 2.5, "util_unknown_s": 0.0,
    "util_unmeasured_s": 0.0, "energy_j": 1200.0, "energy_method": "counter", "power_max_w": 250.0,
    "mem_used_max_b": 2**30, "mem_used_last_b": 2**30, "mem_reserved_b": 2**29, "proc_mem_max_b": 2**30,
    "proc_sm_util_avg_pct": 50.0, "proc_method": "pid", "temp_max_c": 60.0, "sm_clock_avg_mhz": 1400.0,
    "mem_clock_max_mhz": 1593.0, "throttle_s": {},
}  # fmt: skip


def test_chdb_url_opens_the_clickhouse_store(tmp_path: Path) -> None:
    need_module("chdb", "pip install 'gpuledger[clickhouse]'")
    from gpuledger.series.clickhouse import ClickHouseSeries

    store = open_series(f"chdb://{tmp_path}/series", raw_days=3650)
    try:
        assert isinstance(store, ClickHouseSeries) and store.layout.raw_days == 3650
        store.create()
        assert store.write("run-open", [ROW], [], "run-open:0") == 1
        assert [r["busy_s"] for r in store.gpu_intervals("run-open")] == [2.5]
    finally:
        store.close()


@pytest.mark.postgres
def test_postgresql_url_opens_the_compact_store_in_the_schema_named() -> None:
    from gpuledger.series.postgres import PostgresSeries

    schema = f"series_open_{uuid.uuid4().hex[:8]}"
    store = open_series(f"{PG_URL}?schema={schema}")
    try:
        assert isinstance(store, PostgresSeries) and store.schema == schema
        store.create()
        assert store.write("run-open", [ROW], [], "run-open:0") == 1
        assert [r["energy_j"] for r in store.gpu_intervals("run-open")] == [1200.0]
    finally:
        store.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize(
    "url",
    ["sqlite:///tmp/x.db", "mysql://root:s3cret@db/x", "/var/lib/series", "", "http://u:s3cret@h:8123/db"],
)
def test_other_urls_are_refused_by_name_without_the_password(url: str) -> None:
    with pytest.raises(BadSeriesUrl) as err:
        open_series(url)
    text = str(err.value)
    assert "chdb:///abs/folder" in text and "postgresql://" in text
    assert "s3cret" not in text
