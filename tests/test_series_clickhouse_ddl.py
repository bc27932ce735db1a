"""The cluster deployment of the ClickHouse series store (deploy/clickhouse/): its schema.sql is what
the tested single-node DDL's generator writes for a cluster, it parses in the real engine, and the
example config names the cluster and the shards the schema shards over.

A multi-node cluster does not run here; deploy/clickhouse/README.md says so and what is tested.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ci_support import need_module
from gpuledger.series.clickhouse_ddl import Layout, schema_sql

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "clickhouse"


def test_committed_schema_is_the_generators_output() -> None:
    assert (DEPLOY / "schema.sql").read_text() == schema_sql(), (
        "deploy/clickhouse/schema.sql is stale: regenerate it with\n"
        "  python -c 'from gpuledger.series.clickhouse_ddl import schema_sql; print(schema_sql(), end=\"\")' "
        "> deploy/clickhouse/schema.sql"
    )


def _columns(statements: list[str]) -> dict[str, str]:
    """table -> its column block, for every CREATE TABLE with columns."""
    out = {}
    for s in statements:
        m = re.match(r"CREATE TABLE IF NOT EXISTS \w+\.(\w+?)(?:_local)?(?: ON CLUSTER '\w+')?\n\((.*?)\n\)", s, re.S)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def test_cluster_tables_have_the_single_node_columns() -> None:
    one = Layout("gpuledger").statements()
    cluster = Layout("gpuledger", cluster="gpuledger").statements()
    assert _columns(one) == _columns(cluster)
    assert set(_columns(one)) == {
        "gpu_intervals", "host_intervals", "capacity_intervals", "series_names", "run_dims", "gpu_day_rollups",
        "run_day_rollups",
    }  # fmt: skip
    # the run dimensions are whole on every node (one replication group), so each shard joins locally
    every_node = "ReplicatedReplacingMergeTree('/clickhouse/tables/all/gpuledger/run_dims', '{replica}', version)"
    assert every_node in "\n".join(cluster)
    text = "\n".join(cluster)
    assert "Distributed('gpuledger', gpuledger, gpu_intervals_local, gpu)" in text
    assert "Distributed('gpuledger', gpuledger, gpu_day_rollups_local, gpu)" in text
    # a GPU's capacity intervals on the shard of its own intervals
    assert "Distributed('gpuledger', gpuledger, capacity_intervals_local, gpu)" in text
    assert text.count("ReplicatedMergeTree(") == 3 and "ReplicatedSummingMergeTree(" in text
    # the view reads and writes each shard's own tables
    assert "TO gpuledger.gpu_day_rollups_local\nAS SELECT" in text and "FROM gpuledger.gpu_intervals_local)))" in text
    # chargeback's per run and day sums: a view on each shard's own day rollups
    assert "TO gpuledger.run_day_rollups_local\nAS SELECT" in text and "FROM gpuledger.gpu_day_rollups_local\n" in text


def test_every_cluster_statement_parses_in_the_engine(tmp_path: Path) -> None:
    need_module("chdb", "pip install 'gpuledger[clickhouse]'")
    from gpuledger.series.clickhouse_client import ChdbClient

    client = ChdbClient(str(tmp_path / "parse"))
    try:
        for sql in Layout("gpuledger", cluster="gpuledger").statements():
            (formatted,) = client.query("SELECT formatQuerySingleLine({q:String})", {"q": sql})[0]
            assert "ON CLUSTER gpuledger" in formatted, formatted
    finally:
        client.close()


def test_example_config_is_the_schemas_cluster() -> None:
    root = ET.parse(DEPLOY / "cluster.xml").getroot()
    (cluster,) = list(root.find("remote_servers"))
    assert f"ON CLUSTER '{cluster.tag}'" in schema_sql()
    shards = cluster.findall("shard")
    assert [len(s.findall("replica")) for s in shards] == [2, 2]
    assert all(s.findtext("internal_replication") == "true" for s in shards)  # replication by the tables
    assert len(root.findall("zookeeper/node")) == 3
    assert {m.tag for m in root.find("macros")} >= {"shard", "replica"}
    keeper = ET.parse(DEPLOY / "keeper.xml").getroot()
    assert len(keeper.findall("keeper_server/raft_configuration/server")) == 3


@pytest.mark.parametrize("days", [1, 7, 30])
def test_raw_window_is_the_ttl(days: int) -> None:
    assert f"TTL toDateTime(t0) + INTERVAL {days} DAY DELETE" in Layout("g", raw_days=days).script()
