"""The docs are checked against the code so they cannot drift."""

from __future__ import annotations

from pathlib import Path

from gpuledger.reports.run.export import COLUMNS

ROOT = Path(__file__).resolve().parents[1]


def test_export_doc_lists_every_column_in_order_with_its_unit() -> None:
    doc = (ROOT / "docs" / "EXPORT.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    documented = [line.split("`")[1] for line in rows]
    assert documented == [c.name for c in COLUMNS]
    for line, col in zip(rows, COLUMNS, strict=False):
        assert (col.unit or "—") in line


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "pip install -r requirements-test.txt -e '.[dev]' && python -m pytest"
    assert command in readme
    assert command in ci
