"""The store keys names with series/clickhouse_hash.city_hash64 in Python: it must be the engine's own
``cityHash64`` (CityHash64 v1.0.2), or a run's rows would not find the keys the engine and other
writers computed. Checked against the engine (chDB) on every length path: 0-16, 17-32, 33-64 bytes
and the 64-byte loop, with multi-byte UTF-8 and raw bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_support import need_module

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

from gpuledger.series.clickhouse_client import ChdbClient  # noqa: E402
from gpuledger.series.clickhouse_hash import city_hash64  # noqa: E402


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChdbClient]:
    client = ChdbClient(str(tmp_path_factory.mktemp("hash") / "engine"))
    yield client
    client.close()


def _engine_hash(engine: ChdbClient, data: bytes) -> int:
    return int(engine.query("SELECT cityHash64(unhex({h:String}))", {"h": data.hex()})[0][0])


@pytest.mark.parametrize("n", [0, 1, 3, 4, 8, 9, 16, 17, 32, 33, 40, 64, 65, 127, 128, 129, 300])
def test_every_length_path_is_the_engines(engine: ChdbClient, n: int) -> None:
    data = bytes((i * 37 + n) % 256 for i in range(n))
    assert city_hash64(data) == _engine_hash(engine, data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_any_bytes_hash_as_the_engine_hashes_them(engine: ChdbClient, data: bytes) -> None:
    assert city_hash64(data) == _engine_hash(engine, data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(max_size=90))
def test_names_hash_as_their_utf8(engine: ChdbClient, name: str) -> None:
    assert city_hash64(name) == int(engine.query("SELECT cityHash64({n:String})", {"n": name})[0][0])
