"""Fuzzing the API from its own OpenAPI document (schemathesis): whatever the input, no 5xx and
no crash. Bounded: a few dozen examples per operation, as an admin (sees every route's code) and
with an agent token on the ingest route."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from server_support import Tokens, fresh_pg_url, setup_accounts

schemathesis = pytest.importorskip("schemathesis", reason="pip install schemathesis (the dev extra)")

MAX_EXAMPLES = 20
_tokens: dict[str, Tokens] = {}


@pytest.fixture(scope="module")
def api_schema() -> Iterator[object]:
    with fresh_pg_url() as url:
        _tokens["t"] = setup_accounts(url)
        app = create_app(url, settings=Settings(token_cache_s=60))
        yield schemathesis.openapi.from_asgi("/openapi.json", app)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_server_errors(case) -> None:  # type: ignore[no-untyped-def]
    tokens = _tokens["t"]
    token = tokens.agent_a if case.method.upper() in ("POST", "PUT") else tokens.admin
    response = case.call(headers={"Authorization": f"Bearer {token}"})
    assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])
