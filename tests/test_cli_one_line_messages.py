"""Messages a person reads in one line: a rate card with one problem says it on its Error: line,
and a query with nothing to list says so instead of printing a bare header."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuledger.cli.main import cli
from gpuledger.store import Ledger


def test_a_missing_rate_card_is_one_error_line(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/l.db"
    Ledger(db).close()
    out = CliRunner().invoke(cli, ["cost", "--db", db, "--rates", str(tmp_path / "nope.toml")])
    assert out.exit_code == 1
    (line,) = out.output.strip().splitlines()
    assert line.startswith("Error: the rate card has problems: ") and "nope.toml" in line


def test_a_query_with_no_rows_says_none(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/l.db"
    Ledger(db).close()
    out = CliRunner().invoke(cli, ["query", "gpu", "GPU-nothing", "--db", db])
    assert out.exit_code == 0 and out.output.strip() == "Runs on GPU-nothing: none"
