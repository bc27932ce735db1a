"""Where the ledger lives and how failures to open it are reported (no database server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuledger.store import Ledger, LedgerError, LedgerUnavailable, data_dir, default_url, display_url, normalise_url


def test_default_location_precedence(tmp_path: Path) -> None:
    home = {"HOME": "/home/ana"}
    assert default_url(home) == "sqlite:////home/ana/.local/share/gpuledger/ledger.db"
    assert default_url({**home, "XDG_DATA_HOME": "/xdg"}) == "sqlite:////xdg/gpuledger/ledger.db"
    env = {**home, "XDG_DATA_HOME": "/xdg", "GPULEDGER_HOME": "/gl"}
    assert data_dir(env) == Path("/gl") and default_url(env) == "sqlite:////gl/ledger.db"
    assert default_url({**env, "GPULEDGER_DB": "/srv/team.db"}) == "sqlite:////srv/team.db"
    assert default_url({**env, "GPULEDGER_DB": "postgresql://u@db/l"}) == "postgresql+psycopg://u@db/l"
    assert default_url({**env, "GPULEDGER_DB": "  "}) == "sqlite:////gl/ledger.db"  # blank = unset


def test_normalise_url(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalise_url("postgresql://u:p@h:5432/db") == "postgresql+psycopg://u:p@h:5432/db"
    assert normalise_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert normalise_url("postgresql+psycopg://h/db") == "postgresql+psycopg://h/db"
    assert normalise_url("sqlite:///rel.db") == "sqlite:///rel.db"
    assert normalise_url("runs.db") == f"sqlite:///{tmp_path}/runs.db"
    assert normalise_url(tmp_path / "x.db") == f"sqlite:///{tmp_path}/x.db"
    assert normalise_url("~/x.db") == f"sqlite:///{Path.home()}/x.db"


def test_display_url_hides_the_password() -> None:
    shown = display_url("postgresql://ana:s3cret@db.example:5432/ledger")
    assert "s3cret" not in shown and "ana" in shown and "db.example" in shown


def test_bare_path_opens_sqlite_and_creates_folders(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "ledger.db"
    with Ledger(path) as led:
        assert led.dialect == "sqlite" and led.url == f"sqlite:///{path}"
    assert path.exists()
    with Ledger(str(path)):
        pass


def test_default_url_is_used_when_none_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPULEDGER_DB", raising=False)
    monkeypatch.setenv("GPULEDGER_HOME", str(tmp_path / "home"))
    with Ledger() as led:
        assert led.url == f"sqlite:///{tmp_path}/home/ledger.db"


def test_unreachable_postgres_is_unavailable_without_leaking_the_password() -> None:
    # Port 1 on localhost: connection refused at once.
    with pytest.raises(LedgerUnavailable) as err:
        Ledger("postgresql://ana:s3cret@127.0.0.1:1/ledger")
    msg = str(err.value)
    assert "s3cret" not in msg and "127.0.0.1:1" in msg and "server is running" in msg


def test_unwritable_sqlite_location_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(LedgerUnavailable, match="GPULEDGER"):
        Ledger(blocker / "ledger.db")


def test_not_a_database_file(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerUnavailable, match=r"junk\.db"):
        Ledger(path)


def test_unsupported_backend() -> None:
    with pytest.raises(LedgerError, match="SQLite or PostgreSQL"):
        Ledger("mysql://u@h/db")
