"""``gpuledger admin``: users, projects, memberships and API tokens, straight on the database.

Run on a host that can reach the database (the first admin token of a fresh server is made this
way: there is no default user, password or token). Every change is in the audit chain.
"""

from __future__ import annotations

import getpass
import socket

import click

from gpuledger.cli.admin_tables import GPU_COLUMNS, TOKEN_COLUMNS, USER_COLUMNS, gpu_cells, token_cells, user_cells
from gpuledger.cli.common import FiniteFloat, echo_json
from gpuledger.cli.render import print_table
from gpuledger.cli.server_cmds import db_required, server_ledger


def _actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def _account_errors(func):  # type: ignore[no-untyped-def]
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        from gpuledger.store import LedgerError

        try:
            return func(*args, **kwargs)
        except (LedgerError, ValueError) as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


@click.group("admin")
def admin_group() -> None:
    """Users, projects and tokens of a team ledger (on the database, with --db)."""


@admin_group.group("user")
def user_group() -> None:
    """Users."""


@user_group.command("add")
@click.argument("name")
@db_required
@_account_errors
def user_add(name: str, db: str | None) -> None:
    from gpuledger.store import accounts

    accounts.add_user(server_ledger(db), name, actor=_actor())
    click.echo(f"user {name!r} added")


@user_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@db_required
@_account_errors
def user_list(as_json: bool, db: str | None) -> None:
    from gpuledger.store import accounts

    users = accounts.list_users(server_ledger(db))
    if as_json:
        echo_json(users)
        return
    if users:  # a fresh server has nobody: nothing printed
        print_table(USER_COLUMNS, [user_cells(u) for u in users])


@admin_group.group("project")
def project_group() -> None:
    """Projects (a run's ``project`` label names its project)."""


@project_group.command("add")
@click.argument("name")
@db_required
@_account_errors
def project_add(name: str, db: str | None) -> None:
    from gpuledger.store import accounts

    accounts.add_project(server_ledger(db), name, actor=_actor())
    click.echo(f"project {name!r} added")


@project_group.command("list")
@db_required
@_account_errors
def project_list(db: str | None) -> None:
    from gpuledger.store import accounts

    for name in accounts.list_projects(server_ledger(db)):
        click.echo(name)


@admin_group.group("member")
def member_group() -> None:
    """Who belongs to which project."""


@member_group.command("add")
@click.argument("user")
@click.argument("project")
@db_required
@_account_errors
def member_add(user: str, project: str, db: str | None) -> None:
    from gpuledger.store import accounts

    accounts.add_member(server_ledger(db), user, project, actor=_actor())
    click.echo(f"{user!r} is a member of {project!r}")


@member_group.command("remove")
@click.argument("user")
@click.argument("project")
@db_required
@_account_errors
def member_remove(user: str, project: str, db: str | None) -> None:
    from gpuledger.store import accounts

    gone = accounts.remove_member(server_ledger(db), user, project, actor=_actor())
    click.echo(f"{user!r} removed from {project!r}" if gone else f"{user!r} was not a member of {project!r}")


@admin_group.group("token")
def token_group() -> None:
    """API tokens: shown once when issued, stored hashed."""


@token_group.command("issue")
@click.argument("user", default="admin")
@click.option("--role", type=click.Choice(["admin", "member", "agent"]), default="admin", show_default=True)
@click.option("--projects", help="Comma-separated projects the token is limited to (agents: the projects it writes).")
@click.option("--note", help="What the token is for.")
@click.option("--expires-days", type=FiniteFloat(min=0, min_open=True), help="Valid this many days.")
@click.option("--create-user", is_flag=True, help="Add USER first if missing (the first admin of a fresh server).")
@click.option("--host", "host", help="Enroll this machine: the agent token may report its GPUs, capacity and runs, "
              "and nothing of any other host (agents only).")  # fmt: skip
@db_required
@_account_errors
def token_issue(
    user: str, role: str, projects: str | None, note: str | None, expires_days: float | None, create_user: bool,
    host: str | None, db: str | None,
) -> None:  # fmt: skip
    """Issue a token for USER (default: admin). The token is printed once, on stdout."""
    import time

    from gpuledger.store import accounts

    ledger = server_ledger(db)
    wanted = None if projects is None else [p.strip() for p in projects.split(",") if p.strip()]
    if not create_user and not any(u["name"] == user for u in accounts.list_users(ledger)):
        create_user = not accounts.list_users(ledger) and role == "admin"  # a fresh server: its first admin
    expires = None if expires_days is None else time.time() + expires_days * 86400
    token_id, token = accounts.issue_token(
        ledger, user, role=role, projects=wanted, note=note, expires_at=expires, actor=_actor(),
        create_user=create_user, host=host,
    )  # fmt: skip
    bound = f", bound to host {host!r}" if host else ""
    click.echo(f"token {token_id} for {user!r} ({role}{bound}); shown once, keep it secret:", err=True)
    click.echo(token)


@token_group.command("revoke")
@click.argument("token_id")
@db_required
@_account_errors
def token_revoke(token_id: str, db: str | None) -> None:
    from gpuledger.store import accounts

    accounts.revoke_token(server_ledger(db), token_id, actor=_actor())
    click.echo(f"token {token_id} revoked")


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@db_required
@_account_errors
def token_list(as_json: bool, db: str | None) -> None:
    from gpuledger.store import accounts

    tokens = accounts.list_tokens(server_ledger(db))
    if as_json:
        echo_json([t.__dict__ for t in tokens])
        return
    if tokens:
        print_table(TOKEN_COLUMNS, [token_cells(t) for t in tokens])


@admin_group.group("run")
def run_group() -> None:
    """Who owns a run (only its owner's tokens may push it)."""


@run_group.command("transfer")
@click.argument("run_id")
@click.option("--to", "to_user", required=True, help="The user (agent) that owns the run from now on.")
@click.option("--note", help="Why (kept in the audit trail).")
@db_required
@_account_errors
def run_transfer(run_id: str, to_user: str, note: str | None, db: str | None) -> None:
    """Give RUN_ID to another agent (e.g. a re-imaged machine with a new agent user); audited."""
    from gpuledger.store import ownership

    previous = ownership.transfer(server_ledger(db), run_id, to_user, actor=_actor(), note=note)
    click.echo(f"run {run_id} now belongs to {to_user!r} (was {previous or 'nobody'!r})")


@admin_group.group("gpu")
def gpu_group() -> None:
    """Which host (and agent) each GPU UUID belongs to."""


@gpu_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@db_required
@_account_errors
def gpu_list(as_json: bool, db: str | None) -> None:
    from gpuledger.store import ownership

    gpus = ownership.list_gpus(server_ledger(db))
    if as_json:
        echo_json(gpus)
        return
    if gpus:
        print_table(GPU_COLUMNS, [gpu_cells(g) for g in gpus])


@gpu_group.command("rehome")
@click.argument("uuid")
@click.option("--host", required=True, help="The host the GPU is in now.")
@click.option("--agent", help="The agent user that reports it (default: any agent of that host).")
@db_required
@_account_errors
def gpu_rehome(uuid: str, host: str, agent: str | None, db: str | None) -> None:
    """Move GPU UUID to another host / agent (it was moved, or the machine was renamed); audited."""
    from gpuledger.store import ownership

    before = ownership.rehome(server_ledger(db), uuid, host, agent, actor=_actor())
    was = "unregistered" if before is None else f"was {before['host']} ({before['user_name'] or 'any agent'})"
    click.echo(f"GPU {uuid} now belongs to {host} ({agent or 'any agent'}); {was}")
