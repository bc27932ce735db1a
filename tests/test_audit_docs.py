"""docs/AUDIT.md and docs/SERVER.md name only commands and options that exist, and every action the
code appends to the audit trail is documented."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from gpuledger.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]


def _command_lines(doc: str) -> list[str]:
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", doc, flags=re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("gpuledger "):
                lines.append(line.split(">", 1)[0].strip())
    return lines


@pytest.mark.parametrize("name", ["AUDIT.md", "SERVER.md"])
def test_documented_commands_and_options_exist(name: str) -> None:
    lines = _command_lines((ROOT / "docs" / name).read_text())
    assert lines
    for line in lines:
        words = shlex.split(line.replace("…", "x").replace("[", "").replace("]", "").replace("|", " "))[1:]
        command: click.Command = cli
        ctx = click.Context(cli)
        while isinstance(command, click.Group) and words and not words[0].startswith("-"):
            found = command.get_command(ctx, words[0])
            if found is None:
                break
            command, words = found, words[1:]
        options = {opt for p in command.params for opt in getattr(p, "opts", ())}
        for word in words[: words.index("--")] if "--" in words else words:
            if word.startswith("--"):
                assert word.split("=", 1)[0] in options, (line, word)
        assert not isinstance(command, click.Group), line


def test_every_audit_action_is_documented() -> None:
    doc = (ROOT / "docs" / "AUDIT.md").read_text()
    src = "\n".join(p.read_text() for p in (ROOT / "src" / "gpuledger" / "store").glob("*.py"))
    actions = set(re.findall(r'action="([a-z_]+\.[a-z_]+)"', src))
    assert {"run.created", "push.refused", "gpu.registered", "run.transferred"} <= actions
    words = {"run.created": "runs created", "run.changed": "changed (old and new", "run.ended": "ended",
             "run.sealed": "sealed", "run.resealed": "resealed", "run.transferred": "transferred",
             "run.rolled_up": "rolled up", "run.deleted": "deleted", "log.stored": "logs stored",
             "log.deleted": "logs stored and deleted", "push.refused": "pushes refused",
             "user.added": "users", "project.added": "projects", "member.added": "memberships",
             "member.removed": "memberships", "token.issued": "tokens", "token.revoked": "revoked",
             "gpu.registered": "GPUs", "gpu.claimed": "claimed", "gpu.rehomed": "re-homed",
             "run.owner_claimed": "claimed by their next pusher", "rate_card.changed": "rate cards",
             "retention.run": "retention run", "run.revived": "revived",
             "capacity.forget_server": "capacity servers forgotten",
             "run.raw_dropped": "dropped with its partition"}  # fmt: skip
    missing = [a for a in sorted(actions) if a not in words or words[a] not in doc]
    assert missing == []
