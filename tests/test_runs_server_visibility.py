"""``gpuledger runs --server``: a member who sees no run is told that none is visible to them
when the server holds runs of others, and "no runs yet" only when it holds none."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from e2e_helpers import cli_env, run_cli
from server_support import BACKENDS, ServerProcess, backend_url, batch, bearer, run_doc, setup_accounts


def _runs(server: str, token: str, tmp_path: Path, *args: str) -> str:
    token_file = tmp_path / f"token-{abs(hash(token))}"
    token_file.write_text(token)
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/local.db")
    out = run_cli(["runs", "--server", server, "--token-file", str(token_file), *args], env)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_member_who_sees_no_run_is_told_so_not_no_runs_yet(backend: str, tmp_path: Path) -> None:
    with backend_url(backend, tmp_path) as url:
        tokens = setup_accounts(url)
        with ServerProcess(url) as server:
            empty = _runs(server.url, tokens.member_a, tmp_path)
            assert empty.startswith("no runs yet on ")  # the server holds none at all
            run = run_doc(project="B", user="bob", labels={"project": "B", "team": "secret-team"})
            pushed = httpx.post(server.url + "/api/v1/ingest", json=batch(run), headers=bearer(tokens.agent_b))
            assert pushed.status_code == 200, pushed.text
            alice = _runs(server.url, tokens.member_a, tmp_path)
            assert alice == "no runs visible to alice (the server holds runs of other teams or projects)"
            assert "secret-team" not in alice and "bob" not in alice  # whose runs, not said
            assert _runs(server.url, tokens.member_a, tmp_path, "--user", "x") == "no run matches --user x"
            assert "secret-team" in _runs(server.url, tokens.member_b, tmp_path)  # bob sees his run
