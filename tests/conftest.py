"""Shared fixtures.

``ledger_url``: the URL of a fresh, empty ledger database, once per backend:
- ``sqlite``: a file in the test's tmp_path;
- ``postgres`` (marked ``postgres``): a new schema in the server's database, reached through
  ``options=-csearch_path=<schema>`` in the URL, dropped after the test. The server is
  ``$GPULEDGER_TEST_PG_URL`` (default postgresql://postgres@127.0.0.1:5432/test). Set
  ``GPULEDGER_TEST_PG=0`` to skip these; otherwise an unreachable server is an error, because CI
  must test PostgreSQL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

# Property tests check arithmetic, not speed: on a loaded CI machine Hypothesis's per-example
# deadline and its "data generation too slow" check fail tests whose figures are right.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

PG_URL = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def _pg_schema_url() -> Iterator[str]:
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(PG_URL).set(drivername="postgresql")
    conninfo = admin.render_as_string(hide_password=False)
    schema = f"gl_test_{uuid.uuid4().hex[:16]}"
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"PostgreSQL is not reachable at {admin.render_as_string(hide_password=True)} ({exc}); "
            "start it, point GPULEDGER_TEST_PG_URL at one, or set GPULEDGER_TEST_PG=0 to skip"
        ) from exc
    url = admin.set(drivername="postgresql+psycopg").update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SET lock_timeout = '30s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(autouse=True)
def _gpuledger_environment_kept() -> Iterator[None]:
    """A test that leaves a GPULEDGER_* variable changed fails, and the variable is put back: every
    later test's subprocesses inherit this process's environment (a leaked audit checkpoint once
    made later servers refuse to start and later audits report tampering)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("GPULEDGER_")}
    yield
    after = {k: v for k, v in os.environ.items() if k.startswith("GPULEDGER_")}
    if after != before:
        for key in after.keys() - before.keys():
            del os.environ[key]
        os.environ.update(before)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        pytest.fail(f"the test left the environment changed: {', '.join(changed)}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request: pytest.FixtureRequest, tmp_path: os.PathLike[str]) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{os.fspath(tmp_path)}/ledger.db"
        return
    if os.environ.get("GPULEDGER_TEST_PG") == "0":
        pytest.skip("PostgreSQL tests disabled by GPULEDGER_TEST_PG=0")
    yield from _pg_schema_url()


@pytest.fixture
def chdb_series(tmp_path: os.PathLike[str]) -> Iterator[object]:
    """A fresh ClickHouse series store on chDB (the engine in-process) in the test's folder, with a
    ten-year raw window so no test's rows fall past its TTL."""
    from gpuledger.series.clickhouse import ClickHouseSeries

    store = ClickHouseSeries(f"chdb://{os.fspath(tmp_path)}/series", raw_days=3650)
    store.create()
    yield store
    store.close()


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[object]:
    """One private Docker engine for the whole session (tests/docker_support.py), shared by every
    test that needs a real container."""
    from docker_support import private_engine

    yield from private_engine()


@pytest.fixture
def engine(docker_engine: object) -> Iterator[object]:
    """The session's engine, running; this test's containers removed afterwards."""
    from docker_support import engine_for_test

    yield from engine_for_test(docker_engine)  # type: ignore[arg-type]
