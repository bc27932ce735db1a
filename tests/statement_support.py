"""The SQL statements a test's code sends, captured (the ``statements`` fixture)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

# A DELETE of rows from a partitioned table, one of its day partitions or its default partition.
DELETE_ROWS = re.compile(r"\bDELETE\s+FROM\s+(gpu_intervals|host_intervals|gpu_capacity)(_p\d+|_default)?\b", re.I)


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every SQL statement any engine in this process sends while the test runs (the CLI's too)."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
