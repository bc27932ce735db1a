"""docs/CHARGEBACK.md and docs/RATE_CARDS.md are checked against the code so they cannot drift."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

from gpuledger.core.chargeback.columns import COLUMNS
from gpuledger.core.gpumodels import default_table
from gpuledger.core.pricing.ratecard_load import SCHEMA

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _sections(text: str, level: str = "### ") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(level):
            current = line[len(level) :].strip()
            out[current] = []
        elif line.startswith("#"):
            current = None
        elif current is not None and line.startswith("| `"):
            out[current].append(line)
    return out


def test_chargeback_doc_lists_every_column_in_order_with_its_unit() -> None:
    text = (DOCS / "CHARGEBACK.md").read_text()
    columns_part = text[text.index("## Columns") :]
    sections = _sections(columns_part)
    assert list(sections) == list(COLUMNS)
    for name, cols in COLUMNS.items():
        rows = sections[name]
        assert [r.split("`")[1] for r in rows] == [c.name for c in cols], name
        for row, col in zip(rows, cols, strict=False):
            unit = row.split("|")[2].strip()
            assert unit == (col.unit or "—"), (name, col.name)


def test_rate_card_doc_documents_exactly_the_accepted_keys() -> None:
    sections = _sections((DOCS / "RATE_CARDS.md").read_text())
    headings = {
        "card": "[card]",
        "defaults": "[defaults]",
        "gpu": "[[gpu]]",
        "instance": "[[instance]]",
        "models": "[models.KEY]",
    }
    for table, heading in headings.items():
        documented = {r.split("`")[1] for r in sections[heading]}
        assert documented == set(SCHEMA[table]), table


def test_rate_card_doc_shows_the_shipped_normalisation_factors() -> None:
    rows = _sections((DOCS / "RATE_CARDS.md").read_text(), "## ")["The normalisation table"]
    table = default_table()
    documented = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        documented[cells[0].strip("`")] = (Decimal(cells[1]), cells[2])
    assert documented == {k: (m.factor, m.basis) for k, m in table.models.items()}
    for row in rows:
        key = row.split("`")[1]
        for name in re.split(r",\s*", row.split("|")[4].strip()):
            assert table.match(name) == key, name
