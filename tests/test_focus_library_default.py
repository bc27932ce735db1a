"""The library's FOCUS writers (reports/cost/focus_render.py) called without columns write what the
CLI's ``--format focus`` writes without ``--focus-version``: a FOCUS 1.3 dataset, a 1.0 export
(``chargeback_focus``) converted first; ``columns_for("1.0")`` still gives a 1.0 file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cost_sim import CARD, MONTH
from cost_support import ts
from focus_support import chargeback, focus_violations, month_env, read_csv, read_parquet
from gpuledger.cli.focus_output import DEFAULT_FOCUS_VERSION as CLI_DEFAULT
from gpuledger.core.chargeback.focus_v13 import columns_for, to_v13
from gpuledger.reports.cost.focus import chargeback_focus
from gpuledger.reports.cost.focus_render import DEFAULT_FOCUS_VERSION, focus_csv, write_focus_parquet
from gpuledger.store import Ledger


@pytest.fixture(scope="module")
def month(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    env = month_env(tmp_path_factory.mktemp("focus_default"))
    with Ledger(Path(env["db"])) as led:
        export = chargeback_focus(led, scope=None, card=CARD, start=ts(MONTH[0]), end=ts(MONTH[1]))
    cli = chargeback(env, "--format", "focus")
    assert cli.exit_code == 0, cli.output
    return {"env": env, "export": export, "cli_columns": read_csv(cli.stdout)[0]}


def test_the_library_default_version_is_the_clis() -> None:
    assert DEFAULT_FOCUS_VERSION == CLI_DEFAULT == "1.3"


def test_focus_csv_without_columns_writes_the_clis_default_dataset(month: dict[str, Any]) -> None:
    export = month["export"]
    columns, rows = read_csv(focus_csv(export))
    assert columns == [c.name for c in columns_for("1.3")] == month["cli_columns"]
    assert focus_csv(export) == focus_csv(to_v13(export), columns_for("1.3"))
    assert rows and focus_violations("1.3", columns, rows, from_csv=True) == []
    assert {r["ServiceProviderName"] for r in rows} == {r["ProviderName"] for r in rows} != {""}
    # 1.0 when asked for, with the export as it is
    assert read_csv(focus_csv(export, columns_for("1.0")))[0] == [c.name for c in columns_for("1.0")]


def test_write_focus_parquet_without_columns_writes_1_3(month: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "month.parquet"
    write_focus_parquet(month["export"], str(path))
    columns, rows, _ = read_parquet(path)
    assert columns == [c.name for c in columns_for("1.3")]
    assert len(rows) == len(month["export"].rows)
