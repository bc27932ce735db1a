"""docs/CAPACITY.md is checked against the code so it cannot drift: every column in order with its
unit, the pools example parses, the wire row is the agent's, and the front door links to it."""

from __future__ import annotations

from pathlib import Path

from gpuledger.core.capacity.columns import COLUMNS
from gpuledger.core.capacity.model import WIRE_COLUMNS
from gpuledger.core.capacity.pools import parse_pools
from test_cost_docs import _sections

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "CAPACITY.md").read_text()


def test_every_column_is_documented_in_order_with_its_unit() -> None:
    sections = _sections(DOC[DOC.index("## Columns") :])
    assert list(sections) == list(COLUMNS)
    for name, cols in COLUMNS.items():
        rows = sections[name]
        assert [r.split("`")[1] for r in rows] == [c.name for c in cols], name
        for row, col in zip(rows, cols, strict=True):
            assert row.split("|")[2].strip() == col.unit, (name, col.name)
            assert row.split("|")[3].strip() == col.meaning, (name, col.name)


def test_the_pools_example_is_a_valid_pools_file() -> None:
    example = DOC[DOC.index("```toml") + len("```toml") : DOC.index("```", DOC.index("```toml") + 7)]
    pools = parse_pools(example, "docs")
    assert [p.name for p in pools.pools] == ["train-a100", "inference"]
    assert pools.pool_of_host("gpu-a17").instance_type == "p4d.24xlarge"  # type: ignore[union-attr]


def test_the_wire_row_is_the_one_the_agent_sends() -> None:
    assert ", ".join(WIRE_COLUMNS) in " ".join(DOC.split())


def test_readme_and_architecture_link_it() -> None:
    for page in ("README.md", "docs/ARCHITECTURE.md"):
        assert "CAPACITY.md" in (ROOT / page).read_text(), page
