"""The cells of ``gpuledger admin token list``: what a token reaches and whether it still works."""

from __future__ import annotations

from gpuledger.cli.admin_tables import TOKEN_COLUMNS, token_cells
from gpuledger.cli.table_fit import table_lines
from gpuledger.store.accounts import TokenInfo

NOW = 1_790_000_000.0


def _token(**kw: object) -> TokenInfo:
    base: dict = dict(id="3c3ea186fea1", user="bot", role="agent", projects=None, note=None, created_at=NOW - 86400,
                      expires_at=None, revoked_at=None, host=None)  # fmt: skip
    return TokenInfo(**{**base, **kw})


def test_status_says_whether_the_token_still_works() -> None:
    assert token_cells(_token(), NOW)[3] == "active"
    assert token_cells(_token(expires_at=NOW + 60), NOW)[3] == "active"
    assert token_cells(_token(expires_at=NOW - 60), NOW)[3] == "expired"
    assert token_cells(_token(expires_at=NOW - 60, revoked_at=NOW - 3600), NOW)[3] == "revoked"


def test_scope_and_host_read_as_what_the_token_reaches() -> None:
    assert token_cells(_token(role="admin"), NOW)[4:6] == ["(all)", ""]
    assert token_cells(_token(), NOW)[4] == "(memberships)"
    assert token_cells(_token(projects=["vision", "nlp"], host="node-17"), NOW)[4:6] == ["vision,nlp", "node-17"]


def test_a_narrow_terminal_keeps_the_id_and_status_whole() -> None:
    token = _token(user="u" * 200, projects=["p" * 200], host="h" * 200, revoked_at=NOW)
    lines = table_lines(TOKEN_COLUMNS, [token_cells(token, NOW)], 60)
    assert all(len(line) <= 60 for line in lines)
    assert lines[1].startswith("3c3ea186fea1  u") and " agent  revoked " in lines[1]
