"""Fuzzing the API from its own OpenAPI document (schemathesis): whatever the input, no 5xx and
no crash. Bounded: a few dozen examples per operation, as an admin (sees every route's code) and
with an agent token on the write routes.

Each operation's cases come from ``operation.as_strategy()`` inside one plain test (schemathesis'
pytest fixture integration reaches into pytest internals that pytest 9 no longer has)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from ci_support import need_module
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from server_support import Tokens, fresh_pg_url, setup_accounts

schemathesis = need_module("schemathesis", "pip install schemathesis (the dev extra)")

MAX_EXAMPLES = 20


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[object, Tokens]]:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        app = create_app(url, settings=Settings(token_cache_s=60, rate_token_per_s=0, rate_ip_per_s=0))
        yield schemathesis.openapi.from_asgi("/openapi.json", app), tokens


def test_no_server_errors(api) -> None:  # type: ignore[no-untyped-def]
    schema, tokens = api
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    for operation in operations:
        token = tokens.agent_a if operation.method.upper() in ("POST", "PUT") else tokens.admin

        @given(case=operation.as_strategy())
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        def check(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(headers={"Authorization": f"Bearer {token}"})  # noqa: B023 (run at once)
            assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:500])

        check()
