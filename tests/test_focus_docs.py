"""docs/FOCUS.md is checked against the code and the pins, so it cannot drift."""

from __future__ import annotations

from pathlib import Path

from gpuledger.core.chargeback.focus_columns import CUSTOM_COLUMNS, FOCUS_COLUMNS, FOCUS_VERSION

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "FOCUS.md").read_text()


def _table(heading: str) -> list[list[str]]:
    part = DOC[DOC.index(heading) + len(heading) :]
    rows = []
    for line in part.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("| `"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_doc_lists_every_focus_column_in_order_with_its_value() -> None:
    rows = _table("### FOCUS columns")
    assert [(r[0].strip("`"), r[1]) for r in rows] == [(c.name, c.meaning) for c in FOCUS_COLUMNS]
    assert len(rows) == 43  # FOCUS 1.0 defines 43 columns


def test_the_doc_lists_every_custom_column_in_order_with_its_unit() -> None:
    rows = _table("### Custom columns")
    assert [(r[0].strip("`"), r[1], r[2]) for r in rows] == [(c.name, c.unit, c.meaning) for c in CUSTOM_COLUMNS]


def test_the_doc_names_the_focus_version_and_the_validator_pin() -> None:
    pins = dict(line.split("==") for line in (ROOT / "requirements-focus.txt").read_text().splitlines() if "==" in line)
    text = " ".join(DOC.replace("**", "").split())
    assert f"version {FOCUS_VERSION}" in text
    assert f"`focus-validator` {pins['focus-validator']}" in text
    for package in ("multimethod", "pyarrow", "numpy"):
        assert f"{package} {pins[package]}" in text, package
