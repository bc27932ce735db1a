"""``gpuledger db``, ``gpuledger admin`` and ``gpuledger serve`` on a real PostgreSQL: explicit
migrations, no default account, tokens shown once and stored hashed."""

from __future__ import annotations

import os
import subprocess
import sys

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from gpuledger.store import Ledger, migrations, schema, schema_team
from gpuledger.store.engine import Database
from server_support import fresh_pg_url


def gl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPULEDGER_DB"}
    return subprocess.run(
        [sys.executable, "-m", "gpuledger", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _rows(listing: str) -> list[list[str]]:
    """A piped table's lines as cells (the cells in these tests hold no spaces)."""
    return [line.split() for line in listing.splitlines()]


def _row(listing: str, first: str) -> list[str]:
    (row,) = [r for r in _rows(listing) if r[0] == first]
    return row


def test_schema_changes_only_by_command_and_serve_refuses_an_old_schema() -> None:
    with fresh_pg_url() as url:
        status = gl("db", "status", "--db", url)
        assert status.returncode == 1 and "pending 3" in status.stdout and "gpuledger db migrate" in status.stdout
        serve = gl("serve", "--db", url, "--port", "0")
        assert serve.returncode != 0 and "gpuledger db migrate" in serve.stderr
        admin = gl("admin", "user", "list", "--db", url)  # admin commands do not migrate either
        assert admin.returncode != 0 and "gpuledger db migrate" in admin.stderr
        migrate = gl("db", "migrate", "--db", url)
        assert migrate.returncode == 0 and f"from version 0 to {migrations.LATEST}" in migrate.stdout
        assert gl("db", "migrate", "--db", url).stdout.endswith("nothing to do\n")
        assert gl("db", "status", "--db", url).returncode == 0


def test_a_schema_or_privilege_the_user_lacks_is_one_error_line() -> None:
    """A search_path naming a schema that does not exist (or that the user may not use) is said as
    such, not "schema version 0: run db migrate" (which then failed with a traceback); a user without
    CREATE on the schema gets one line from db migrate, not a traceback."""
    with fresh_pg_url() as url:
        parsed = make_url(url)
        schema_name = parsed.query["options"].split("=", 1)[1]
        missing = parsed.update_query_dict({"options": f"-csearch_path={schema_name}_missing"})
        for args in (("db", "migrate"), ("db", "status"), ("serve", "--port", "0")):
            got = gl(*args, "--db", missing.render_as_string(hide_password=False))
            assert got.returncode == 1, (args, got.stderr)
            assert got.stderr.startswith("Error: ") and got.stderr.count("\n") == 1, (args, got.stderr)
            assert "refused this user: no schema of the search_path" in got.stderr, (args, got.stderr)
        # pg_read_all_data: may use every schema, create in none (a session role the test's superuser may take)
        reader = parsed.update_query_dict({"options": f"-csearch_path={schema_name} -crole=pg_read_all_data"})
        got = gl("db", "migrate", "--db", reader.render_as_string(hide_password=False))
        assert got.returncode == 1 and got.stderr.count("\n") == 1, got.stderr
        assert f"refused this user: permission denied for schema {schema_name}" in got.stderr, got.stderr


def test_migration_3_upgrades_an_existing_version_2_ledger() -> None:
    with fresh_pg_url() as url:
        Ledger(url).close()
        fresh = _columns(url)
        db = Database(url)
        db.write(lambda c: [c.execute(sa.text(f'DROP TABLE "{t}" CASCADE')) for t in schema_team.NAMES])
        db.write(lambda c: c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 3)))
        assert db.read(migrations.current_version) == 2
        assert migrations.upgrade(db) == migrations.LATEST
        db.close()
        assert _columns(url) == fresh


def _columns(url: str) -> dict[str, list[tuple[str, str]]]:
    db = Database(url)
    try:
        return db.read(
            lambda c: {
                t: [(col["name"], str(col["type"])) for col in sa.inspect(c).get_columns(t)]
                for t in sorted(sa.inspect(c).get_table_names())
            }
        )
    finally:
        db.close()


def test_admin_commands_and_tokens_shown_once_stored_hashed() -> None:
    with fresh_pg_url() as url:
        gl("db", "migrate", "--db", url)
        assert gl("admin", "user", "list", "--db", url).stdout == ""  # a fresh server has nobody
        first = gl("admin", "token", "issue", "--db", url)
        assert first.returncode == 0, first.stderr
        admin_token = first.stdout.strip()
        assert admin_token.startswith("glt_") and "shown once" in first.stderr
        for args in (
            ("admin", "project", "add", "vision"),
            ("admin", "user", "add", "alice"),
            ("admin", "member", "add", "alice", "vision"),
        ):
            done = gl(*args, "--db", url)
            assert done.returncode == 0, done.stderr
        assert gl("admin", "member", "add", "alice", "nope", "--db", url).returncode == 1
        users = _rows(gl("admin", "user", "list", "--db", url).stdout)
        assert users[0][:2] == ["NAME", "STATUS"] and users[0][-1] == "PROJECTS"
        alice = next(r for r in users if r[0] == "alice")
        assert alice[1] == "active" and alice[-1] == "vision"  # the user, enabled, member of vision
        agent = gl("admin", "token", "issue", "bot", "--role", "agent", "--projects", "vision", "--db", url)
        assert agent.returncode == 1 and "no user 'bot'" in agent.stderr
        gl("admin", "user", "add", "bot", "--db", url)
        agent = gl("admin", "token", "issue", "bot", "--role", "agent", "--projects", "vision", "--db", url)
        agent_token = agent.stdout.strip()
        listing = gl("admin", "token", "list", "--db", url).stdout
        assert agent_token[4:16] in listing and "vision" in listing
        with Ledger(url) as led:
            dump = led.read(lambda c: repr(list(c.execute(sa.select(schema.api_tokens)))))
        for token in (admin_token, agent_token):
            assert token not in listing and token not in dump and token.split("_", 2)[2] not in dump
        revoke = gl("admin", "token", "revoke", agent_token[4:16], "--db", url)
        assert revoke.returncode == 0
        revoked = _row(gl("admin", "token", "list", "--db", url).stdout, agent_token[4:16])
        assert revoked[1:4] == ["bot", "agent", "revoked"] and revoked[4] == "vision"
        node = gl("admin", "token", "issue", "bot", "--role", "agent", "--host", "node-17", "--db", url)
        assert node.returncode == 0 and "bound to host 'node-17'" in node.stderr, node.stderr  # node-17 enrolled
        listing = gl("admin", "token", "list", "--db", url).stdout
        header = listing.splitlines()[0].split()
        assert header[:5] == ["ID", "USER", "ROLE", "STATUS", "PROJECTS"] and header[5] == "HOST", header
        bound = _row(listing, node.stdout.strip()[4:16])  # the new token: bot's, active, bound to node-17
        assert bound[1:6] == ["bot", "agent", "active", "(memberships)", "node-17"], bound
        first_admin = _row(listing, admin_token[4:16])
        assert first_admin[2:5] == ["admin", "active", "(all)"] and "node-17" not in first_admin
        moved = gl("admin", "gpu", "rehome", "GPU-5f1c", "--host", "node-17", "--agent", "bot", "--db", url)
        assert moved.returncode == 0, moved.stderr
        gpu = _row(gl("admin", "gpu", "list", "--db", url).stdout, "GPU-5f1c")
        assert gpu[1:3] == ["node-17", "bot"] and gpu[-1] == "admin", gpu  # host, agent, set by an admin
        wrong = gl("admin", "token", "issue", "alice", "--role", "member", "--host", "node-17", "--db", url)
        assert wrong.returncode == 1 and "only agent tokens are bound to a host" in wrong.stderr
        verify = gl("audit", "verify", "--db", url)
        assert verify.returncode == 0 and verify.stdout.startswith("OK"), verify.stdout
