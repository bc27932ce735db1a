"""--token-file with no token on its first line is refused before any work (exit 2, one Error line).

Before, an empty token file (a failed ``gpuledger admin token issue ... > FILE``) sent no token, the
run pushed nothing and the server's 401 pointed at GPULEDGER_TOKEN instead of the file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuledger.cli.main import cli

# Each command that takes --token-file, with what it needs besides; none of them may reach a server.
COMMANDS = [
    ["run", "--server", "http://127.0.0.1:9", "--no-gpu", "--", "true"],
    ["runs", "--server", "http://127.0.0.1:9"],
    ["sync", "--server", "http://127.0.0.1:9"],
    ["agent", "--server", "http://127.0.0.1:9"],
]


@pytest.mark.parametrize("content", ["", "\n", "   \nglt_second_line\n"])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_token_file_without_token_is_a_usage_error(
    tmp_path: Path, args: list[str], content: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Were the check gone, the work would start: fail fast instead of metering or serving forever.
    def reached_work(*_a: object, **_k: object) -> None:
        raise AssertionError("the command started its work with a token file holding no token")

    import gpuledger.agent.remote
    import gpuledger.cli.agent_cmd
    import gpuledger.recorder.wrap

    monkeypatch.setattr(gpuledger.recorder.wrap, "run_and_exit_code", reached_work)
    monkeypatch.setattr(gpuledger.cli.agent_cmd, "_run", reached_work)
    monkeypatch.setattr(gpuledger.agent.remote, "list_remote_runs", reached_work)
    token_file = tmp_path / "admin.token"
    token_file.write_text(content)
    env = {"GPULEDGER_HOME": str(tmp_path / "home"), "GPULEDGER_TOKEN": ""}
    argv = [args[0], "--token-file", str(token_file), *args[1:]]
    result = CliRunner().invoke(cli, argv, env=env)
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    assert "holds no token on its first line" in errors[0]
    assert str(token_file) in errors[0]
    assert not (tmp_path / "home").exists()  # refused before any work: no ledger was created


def test_token_file_with_token_passes(tmp_path: Path) -> None:
    from gpuledger.cli.token_file_check import token_file_given

    token_file = tmp_path / "t"
    token_file.write_text("glt_abc_def\n")
    assert token_file_given(None, None, str(token_file)) == str(token_file)  # type: ignore[arg-type]
    assert token_file_given(None, None, None) is None  # type: ignore[arg-type]


def test_a_refused_token_points_at_where_it_came_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 401 names the token's source: the --token-file file when it came from one, not GPULEDGER_TOKEN
    (which was unset: the hint sent people to the wrong place)."""
    import httpx

    from gpuledger.agent.client import Client, Unauthorized, token_from

    refused = httpx.MockTransport(lambda _r: httpx.Response(401, json={"detail": "invalid, expired or revoked token"}))
    token_file = tmp_path / "node.token"
    token_file.write_text("glt_000000000000_" + "x" * 43 + "\n")
    monkeypatch.delenv("GPULEDGER_TOKEN", raising=False)
    for env, expected, wrong in (
        (None, "check the token in the --token-file file", "GPULEDGER_TOKEN"),
        ("glt_111111111111_" + "y" * 43, "check the token in the --token-file file", "GPULEDGER_TOKEN"),
    ):
        if env:
            monkeypatch.setenv("GPULEDGER_TOKEN", env)  # the file wins (token_from): the file is to check
        client = Client("http://ledger.test", token_from(None, str(token_file)), transport=refused)
        with client, pytest.raises(Unauthorized) as err:
            client.me()
        assert expected in str(err.value) and wrong not in str(err.value), str(err.value)
    monkeypatch.setenv("GPULEDGER_TOKEN", "glt_222222222222_" + "z" * 43)
    client = Client("http://ledger.test", token_from(None, None), transport=refused)
    with client, pytest.raises(Unauthorized, match=r"\(check GPULEDGER_TOKEN\)"):
        client.me()
