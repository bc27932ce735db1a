"""The screens people read, in real terminals (tmux) of 80x24 and 120x40: runs, top, cost, show
and report capacity on a ledger recorded with replayed GPUs. Ids and statuses whole, one line per
row with its cells, figures whole, no line wider than the terminal (tmux would wrap it)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator

import pytest

from e2e_helpers import GPULEDGER, cli_env, py, run_cli, runs_json
from gpuledger.core.units import fmt_hours, fmt_money
from tmux_support import Terminal

pytestmark = pytest.mark.slow

SIZES = [(80, 24), (120, 40)]
LONG_NAME = "n" * 10_000
LONG_ARG = "--very-long-argument=" + "a" * 300
REPLAY = ["--replay-gpus", "a100x2-example", "--interval", "0.5"]


class World:
    def __init__(self, env: dict[str, str], runs: list[dict], live: dict, terminal: Terminal) -> None:
        self.env, self.runs, self.live, self.terminal = env, runs, live, terminal

    def screen(self, args: list[str], width: int, height: int) -> list[str]:
        return self.terminal.run([*GPULEDGER, *args], width, height)


def _record(env: dict[str, str], *args: str) -> None:
    out = run_cli(["run", "-q", *REPLAY, *args], env)
    assert out.returncode in (0, 3), out.stderr.decode()


def _live_top(env: dict[str, str]) -> dict:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = run_cli(["top", "--once", "--json"], env)
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        if rows and len(rows[0]["gpus"]) == 2:
            return rows[0]
        time.sleep(0.2)
    raise AssertionError("the live run never showed in gpuledger top")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("screens")
    env = cli_env(root / "home", f"sqlite:///{root}/ledger.db", GPULEDGER_RATES="")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    terminal = Terminal(env)
    _record(env, "--name", LONG_NAME, "--project", "vision", "--team", "platform", "--label", "dataset=coco",
            "--", *py("import time; time.sleep(1.2)"))  # fmt: skip
    _record(env, "--project", "detector-research", "--team", "platform-infrastructure",
            "--", *py("import time; time.sleep(1.2)"), LONG_ARG)  # fmt: skip
    _record(env, "--name", "short", "--", *py("import sys; sys.exit(3)"))
    live = subprocess.Popen([*GPULEDGER, "run", "-q", *REPLAY, "--name", "live-" + "x" * 200, "--",
                             *py("import time; time.sleep(600)")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        top = _live_top(env)
        yield World(env, runs_json(env), top, terminal)
    finally:
        live.terminate()
        live.wait(60)
        terminal.close()


def _one_line(lines: list[str], start: str) -> str:
    found = [line for line in lines if line.startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_runs_one_line_per_run_with_its_user_name_and_figures(world: World, width: int, height: int) -> None:
    lines = world.screen(["runs"], width, height)
    assert lines[0].startswith("ID ") and "STATUS" in lines[0] and "USER" in lines[0]
    for run in world.runs:
        line = _one_line(lines, run["short_id"] + " ")
        assert f" {run['status']} " in line and f" {run['user']} " in line
        label = run["name"] or " ".join(run["command"])
        assert label[:4] in line  # a cut name or command: rows can be told apart
        if run["status"] != "running":  # a live run's figures move between the two reads
            assert f" {fmt_hours(run['busy_gpu_hours'])} " in line  # the figure whole
    assert all(len(line) <= width for line in lines)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_top_one_line_per_run_and_per_gpu_numbers_whole(world: World, width: int, height: int) -> None:
    lines = world.screen(["top", "--once"], width, height)
    run_line = _one_line(lines, _short(world))
    assert f" {world.live['user']} " in run_line
    assert "[replayed] liv" in run_line  # the name, cut, on the run's own line
    for index in (0, 1):
        gpu = _one_line(lines, f"  GPU {index} ")
        assert re.search(r" \d+(\.\d)?% +\d+(\.\d)?/80G +\d+(\.\d)?G +\d+W ", gpu), gpu  # compact, whole units
    assert all(len(line) <= width for line in lines)


def _short(world: World) -> str:
    return next(r["short_id"] for r in world.runs if r["id"] == world.live["id"]) + " "


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_top_live_view_fits_the_terminal(world: World, width: int, height: int) -> None:
    name = world.terminal.start([*GPULEDGER, "top", "--interval", "0.5"], width, height)
    try:
        start = _short(world)
        lines = world.terminal.wait_for(name, lambda lines: any(line.startswith(start) for line in lines))
        assert lines == world.terminal.lines(name, join_wrapped=True)
        assert any(line.startswith("  GPU 1 ") for line in lines)
        world.terminal.send(name, "C-c")
        world.terminal.wait_for(name, lambda lines: any(line.strip() == "__screen_done__" for line in lines))
    finally:
        world.terminal.kill(name)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_cost_keeps_cost_on_each_runs_row(world: World, width: int, height: int) -> None:
    done = [r for r in world.runs if r["status"] != "running"]
    lines = world.screen(["cost", *(r["short_id"] for r in done)], width, height)
    header = next(line for line in lines if "RUN_ID" in line)
    assert (" COST" in header and "FLAGS" not in header.split("IDLE COST")[-1]) or width >= 120
    report = json.loads(run_cli(["cost", "--json", *(r["short_id"] for r in done)], world.env).stdout)
    for run, costed in zip(done, report["runs"], strict=True):
        line = _one_line(lines, "  " + run["short_id"] + " ")
        assert " all " in line and f" {fmt_money(costed['total']['cost'])}" in line
    assert all(len(line) <= width for line in lines)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_show_names_who_pays_and_fits(world: World, width: int, height: int) -> None:
    named = next(r for r in world.runs if r["name"] == LONG_NAME)
    lines = world.screen(["show", named["short_id"]], width, height)
    assert lines[0].startswith(f"run {named['id']} ({named['short_id']})") and "succeeded" in " ".join(lines[:3])
    assert "  project    vision   team platform   labels dataset=coco" in lines
    for index in (0, 1):
        head = _one_line(lines, f"  GPU {index}  ")
        assert "NVIDIA A100-SXM4-80GB" in head
    text = "\n".join(lines)
    assert re.search(r"VRAM \d+(\.\d+)? [KMG]iB \(run \d+(\.\d+)? [KMG]iB\)", text)  # no figure split from its unit
    assert not any(re.match(r"\s*(GiB|MiB|kWh|W|°C)\b", line) for line in lines)
    long_cmd = next(r for r in world.runs if LONG_ARG in r["command"])
    command = _one_line(world.screen(["show", long_cmd["short_id"]], width, height), "  command    ")
    assert len(command) == width and command.endswith("…")  # cut at the terminal, not at 100
    assert all(len(line) <= width for line in lines)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_report_capacity_fits(world: World, width: int, height: int) -> None:
    lines = world.screen(["report", "capacity", "--include-replayed"], width, height)
    header = next(line for line in lines if line.startswith("  HOST "))
    assert "GPUS" in header and "FLEET COST" in header
    total = _one_line(lines, "  TOTAL ")
    assert re.search(r" 2 ", total)  # the two replayed GPUs, whole
    assert all(len(line) <= width for line in lines)


def test_piped_runs_keep_the_10kb_name_whole_without_padding_other_lines(world: World) -> None:
    out = run_cli(["runs"], world.env)
    lines = out.stdout.decode().splitlines()
    named = next(r for r in world.runs if r["name"] == LONG_NAME)
    assert LONG_NAME in _one_line(lines, named["short_id"] + " ")
    for run in world.runs:  # every other line is as long as its own cells, not padded to 10 kB
        label = run["name"] or " ".join(run["command"])
        line = _one_line(lines, run["short_id"] + " ")
        assert label in line.replace("[replayed] ", "") and len(line) < len(label) + 250
        assert line == line.rstrip()


@pytest.fixture(scope="module")
def token_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], list[dict]]]:
    """A server ledger (SQLite) with tokens whose users, projects and hosts are long: at 80 columns
    they cannot all fit, the ids and statuses must."""
    root = tmp_path_factory.mktemp("tokens")
    env = cli_env(root / "home", f"sqlite:///{root}/server.db")
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    assert run_cli(["db", "migrate"], env).returncode == 0
    issued = [["admin", "token", "issue"], ["admin", "project", "add", "detector-research"]]
    for n in range(3):
        user, host = f"agent-of-the-{'very-' * 6}long-node-{n}", f"node-{n}.{'rack' * 10}.example.org"
        issued.append(["admin", "project", "add", f"vision-{n}"])
        issued.append(["admin", "token", "issue", user, "--role", "agent", "--create-user", "--host", host,
                       "--projects", f"vision-{n},detector-research"])  # fmt: skip
    for args in issued:
        out = run_cli(args, env)
        assert out.returncode == 0, out.stderr.decode()
    tokens = json.loads(run_cli(["admin", "token", "list", "--json"], env).stdout)
    assert run_cli(["admin", "token", "revoke", tokens[1]["id"]], env).returncode == 0
    yield env, json.loads(run_cli(["admin", "token", "list", "--json"], env).stdout)


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_admin_token_list_keeps_ids_and_statuses_whole(
    token_ledger: tuple[dict[str, str], list[dict]], width: int, height: int
) -> None:
    env, tokens = token_ledger
    terminal = Terminal(env)
    try:
        lines = terminal.run([*GPULEDGER, "admin", "token", "list"], width, height)  # fails on a wrapped row
    finally:
        terminal.close()
    assert lines[0].startswith("ID ") and " ROLE " in lines[0] and " STATUS" in lines[0]
    for token in tokens:
        line = _one_line(lines, token["id"] + " ")
        status = "revoked" if token["revoked_at"] else "active"
        assert f" {token['role']}  " in line and f" {status}" in line, line
        assert token["user"][:4] in line  # the user, cut if need be, on the token's own line
    assert sum(1 for t in tokens if t["revoked_at"]) == 1
    assert all(len(line) <= width for line in lines)
