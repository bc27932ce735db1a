"""docs/YOLO.md is checked against the code so it cannot drift."""

from __future__ import annotations

from pathlib import Path

from gpuledger.core.training.failures import KINDS
from gpuledger.reports.run.epochs import EXPORT_COLUMNS

DOC = Path(__file__).resolve().parents[1] / "docs" / "YOLO.md"


def test_epoch_export_columns_are_documented_in_order() -> None:
    # the table of the "gpuledger export RUN --metrics" section only (the evaluation section has its own)
    section = DOC.read_text().split("## `gpuledger export RUN --metrics`", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in rows]
    expected = [[name, kind, unit or "—", meaning] for name, kind, unit, meaning in EXPORT_COLUMNS]
    assert documented == expected


def test_failure_kinds_are_documented() -> None:
    text = DOC.read_text()
    assert all(f"`{kind}`" in text for kind in KINDS)
