"""Every command with each class of bad input: one ``Error:`` line, the documented exit status, no
traceback, and nothing lost (the ledger as it was, no output file half-written or clobbered).

Exit status 2 is a usage error, refused before any work (a bad option value, an output folder that
does not exist, a ledger URL that can never work); 1 is a failure of the command itself (an
unknown run, a broken rate card, a missing optional extra).
"""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from diag_support import T0
from gpuledger.cli.main import cli
from gpuledger.core.ids import short_id
from gpuledger.store import Ledger
from report_support import write_run

RUN_A = "0190d0d0-0000-7000-8000-00000000aaaa"
RUN_B = "0190d0d0-0000-7000-8000-00000000bbbb"
BROKEN_CARD = '[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "A100"\nprice_per_hour = "x"\n'

# The smallest valid arguments of every command that opens a ledger ({a}, {b}: two runs' short ids).
LEDGER_COMMANDS: dict[str, list[str]] = {
    "admin gpu list": [],
    "agent": [],
    "admin gpu rehome": ["GPU-x", "--host", "h"],
    "admin member add": ["ana", "detector"],
    "admin member remove": ["ana", "detector"],
    "admin project add": ["detector"],
    "admin project list": [],
    "admin run transfer": [RUN_A, "--to", "ana"],
    "admin token issue": ["ana"],
    "admin token list": [],
    "admin token revoke": ["1"],
    "admin user add": ["ana"],
    "admin user list": [],
    "audit head": [],
    "audit key start": [],
    "audit seal": [],
    "audit verify": [],
    "compare": ["{a}", "{b}"],
    "cost": ["{a}"],
    "db migrate": [],
    "db status": [],
    "export": ["{a}"],
    "import ultralytics": ["{home}"],
    "lineage": ["{a}"],
    "logs": ["{a}"],
    "query configs": [],
    "query failures": [],
    "query gpu": ["GPU-x"],
    "query gpu-hours": [],
    "recover": [],
    "report capacity": [],
    "report chargeback": [],
    "report fleet": [],
    "report rollup": [],
    "report run": ["{a}"],
    "retention run": [],
    "run": ["--", sys.executable, "-c", "open('{marker}', 'w')"],
    "runs": [],
    "serve": [],
    "show": ["{a}"],
    "sync": ["--server", "http://127.0.0.1:9", "--status"],
    "top": ["--once"],
}
# Commands that would start work that outlives the test if the refusal failed: run in their own process.
OWN_PROCESS = {"run", "agent"}
OUTPUT_COMMANDS = [
    ["export", "{a}", "-o"],
    ["export", "{a}", "--format", "parquet", "-o"],
    ["export", "{a}", "--metrics", "--format", "jsonl", "-o"],
    ["report", "run", "{a}", "-o"],
    ["report", "run", "{a}", "--format", "json", "-o"],
    ["report", "chargeback", "--format", "csv", "-o"],
    ["report", "capacity", "--format", "html", "-o"],
    ["report", "fleet", "-o"],
    ["compare", "{a}", "{b}", "-o"],
    ["compare", "{a}", "{b}", "--format", "html", "-o"],
]
RUN_COMMANDS = [["show"], ["logs"], ["export"], ["cost"], ["report", "run"], ["compare", "{a}"]]
NON_FINITE = [
    ["top", "--once", "--interval"],
    ["query", "failures", "--short"],
    ["report", "chargeback", "--anomaly-threshold"],
    ["serve", "--max-body-mb"],
]
FORMAT_COMMANDS = [["runs"], ["show", "{a}"], ["cost", "{a}"], ["query", "gpu-hours"], ["query", "failures"],
                   ["query", "configs"], ["query", "gpu", "GPU-x"], ["top"], ["db", "status"],
                   ["report", "run", "{a}"], ["report", "chargeback"], ["compare", "{a}", "{b}"],
                   ["report", "capacity"], ["report", "fleet"],
                   ["import", "ultralytics", "{home}"]]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("bad-input")
    db = root / "ledger.db"
    with Ledger(db) as ledger:
        write_run(ledger, RUN_A, status="succeeded", starved=False, name="a", started_at=T0 - 86400)
        write_run(ledger, RUN_B, status="failed", name="b")
    (root / "card.toml").write_text(BROKEN_CARD)
    (root / "home").mkdir()
    return {"db": str(db), "root": str(root), "home": str(root / "home"), "card": str(root / "card.toml")}


def _fill(args: list[str], world: dict[str, str]) -> list[str]:
    marker = str(Path(world["root"]) / "command-ran")
    values = {"a": short_id(RUN_A), "b": short_id(RUN_B), "home": world["home"], "marker": marker}
    return [a.format(**values) if "{" in a else a for a in args]


def _env(world: dict[str, str], **extra: str) -> dict[str, str]:
    return {"GPULEDGER_HOME": world["home"], "GPULEDGER_DB": world["db"], "GPULEDGER_RATES": "", **extra}


def fingerprint(world: dict[str, str]) -> str:
    """Everything stored: a change of any row of any table changes it."""
    conn = sqlite3.connect(f"file:{world['db']}?mode=ro", uri=True)
    try:
        digest = hashlib.sha256()
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}" ORDER BY 1'):  # table names come from the schema
                digest.update(repr(row).encode())
        return digest.hexdigest()
    finally:
        conn.close()


def files_under(folder: str) -> set[str]:
    return {str(p) for p in Path(folder).rglob("*")}


@pytest.fixture
def unchanged(world: dict[str, str]) -> Iterator[None]:
    """The ledger, the data directory and the test folder are exactly as before the command."""
    before = (fingerprint(world), files_under(world["root"]))
    yield
    assert (fingerprint(world), files_under(world["root"])) == before, "bad input changed or lost data"


def invoke(args: list[str], world: dict[str, str], **env: str) -> Result:
    return CliRunner().invoke(cli, args, env=_env(world, **env))


def assert_one_error(result: Result, status: int, *expected: str) -> None:
    shown = result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"traceback: {result.exception!r}\n{shown}"
    )
    assert "Traceback" not in shown
    assert result.exit_code == status, shown
    errors = [line for line in shown.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, shown
    for text in expected:
        assert text in shown, shown


def run_cli(args: list[str], world: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    """``gpuledger run`` in a real process: it must refuse before COMMAND starts."""
    import os

    full_env = {**os.environ, **_env(world, **env)}
    return subprocess.run([sys.executable, "-m", "gpuledger", *args], env=full_env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_the_list_covers_every_command_that_opens_a_ledger() -> None:
    found = set()

    def walk(cmd: click.Command, path: list[str]) -> None:
        if any(p.name == "db" for p in cmd.params):  # a group that runs itself (agent) counts too
            found.add(" ".join(path))
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])  # type: ignore[arg-type]

    walk(cli, [])
    assert found == set(LEDGER_COMMANDS), "a command with --db is missing from this test's list"


@pytest.mark.parametrize("bad_url", ["foo://bar", "postgresql+nodriver://x@127.0.0.1/y", "::not a url::x://"])
@pytest.mark.parametrize("command", sorted(LEDGER_COMMANDS))
def test_an_unusable_ledger_url_is_refused_before_any_work(
    command: str, bad_url: str, world: dict[str, str], unchanged: None
) -> None:
    args = [*command.split(), *_fill(LEDGER_COMMANDS[command], world)]
    if command in OWN_PROCESS:
        out = run_cli([*args[:1], "--db", bad_url, *args[1:]], world)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.count("Error:") == 1 and "--db" in out.stderr
        assert not (Path(world["root"]) / "command-ran").exists()  # COMMAND never started
        return
    result = invoke([*args, "--db", bad_url], world)
    assert_one_error(result, 2, "--db")


@pytest.mark.parametrize("command", sorted(set(LEDGER_COMMANDS) - OWN_PROCESS))
def test_postgresql_without_its_driver_names_the_extra(
    command: str, world: dict[str, str], unchanged: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # what an install without [postgres] looks like
    args = [*command.split(), *_fill(LEDGER_COMMANDS[command], world), "--db", "postgresql://x@127.0.0.1:1/y"]
    assert_one_error(invoke(args, world), 2, "pip install 'gpuledger[postgres]'")


def test_run_with_a_url_that_cannot_work_starts_nothing_and_spools_nothing(world: dict[str, str]) -> None:
    marker = Path(world["root"]) / "command-ran"
    out = run_cli(["run", "--db", "foo://bar", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], world)
    assert out.returncode == 2 and "unsupported database foo://bar" in out.stderr
    assert not marker.exists()
    assert not (Path(world["home"]) / "spool").exists() and not (Path(world["home"]) / "logs").exists()


@pytest.mark.parametrize("command", OUTPUT_COMMANDS, ids=" ".join)
def test_an_output_file_in_a_missing_folder_is_refused_before_any_work(
    command: list[str], world: dict[str, str], unchanged: None
) -> None:
    target = Path(world["root"]) / "no-such-folder" / "out.file"
    result = invoke([*_fill(command, world), str(target)], world)
    assert_one_error(result, 2, "no-such-folder", "does not exist")
    assert not target.parent.exists()


@pytest.mark.parametrize("command", OUTPUT_COMMANDS, ids=" ".join)
def test_an_output_path_that_is_a_folder_is_refused_and_left_alone(
    command: list[str], world: dict[str, str], unchanged: None
) -> None:
    assert_one_error(invoke([*_fill(command, world), world["home"]], world), 2, "is a folder")


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=" ".join)
def test_an_unknown_run_is_one_error_line(command: list[str], world: dict[str, str], unchanged: None) -> None:
    assert_one_error(invoke([*_fill(command, world), "zzzzzzzz"], world), 1, "no run matches 'zzzzzzzz'")


@pytest.mark.parametrize("value", ["nan", "inf", "-nan"])
@pytest.mark.parametrize("command", NON_FINITE, ids=" ".join)
def test_a_non_finite_number_is_refused(command: list[str], value: str, world: dict[str, str], unchanged: None) -> None:
    assert_one_error(invoke([*command, value], world), 2, "Invalid value")


def _float_options() -> list[list[str]]:
    """[command path..., option] for every option of every command that takes a real number."""
    found: list[list[str]] = []

    def walk(cmd: click.Command, path: list[str]) -> None:
        for param in cmd.params:  # a group's own too: agent runs itself and has subcommands
            if isinstance(param, click.Option) and isinstance(param.type, click.types.FloatParamType):
                found.append([*path, param.opts[0]])
        if isinstance(cmd, click.Group):
            ctx = click.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), [*path, name])  # type: ignore[arg-type]

    walk(cli, [])
    return found


FLOAT_OPTIONS = _float_options()


def test_the_float_options_are_found() -> None:
    assert ["retention", "run", "--raw-days"] in FLOAT_OPTIONS and ["run", "--interval"] in FLOAT_OPTIONS


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("option", [o for o in FLOAT_OPTIONS if o[0] not in OWN_PROCESS], ids=" ".join)
def test_every_real_number_option_refuses_a_non_finite_value(
    option: list[str], value: str, world: dict[str, str], unchanged: None
) -> None:
    # The bad value first: click checks options in the order they were given, so nothing else
    # (a missing argument, a ledger) can answer before the refusal this test is about.
    command = " ".join(option[:-1])
    args = [*option, value, *_fill(LEDGER_COMMANDS.get(command, []), world)]
    assert_one_error(invoke(args, world), 2, "Invalid value", option[-1])


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_run_with_a_non_finite_interval_starts_nothing(value: str, world: dict[str, str]) -> None:
    marker = Path(world["root"]) / "command-ran"
    before = fingerprint(world)
    out = run_cli(["run", "--interval", value, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], world)
    assert out.returncode == 2 and "--interval" in out.stderr and "Traceback" not in out.stderr
    assert not marker.exists() and fingerprint(world) == before


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_the_node_agent_with_a_non_finite_interval_does_not_start(
    value: str, world: dict[str, str], unchanged: None
) -> None:
    out = run_cli(["agent", "--interval", value], world)  # accepted, it would run until the timeout
    assert out.returncode == 2 and out.stderr.count("Error:") == 1 and "--interval" in out.stderr


@pytest.mark.parametrize(
    "command", [["cost", "{a}"], ["report", "chargeback"], ["report", "capacity"], ["report", "fleet"]], ids=" ".join
)
def test_a_broken_rate_card_given_with_rates(command: list[str], world: dict[str, str], unchanged: None) -> None:
    result = invoke([*_fill(command, world), "--rates", world["card"]], world)
    assert_one_error(result, 1, "the rate card has problems", f"{world['card']}:5: [[gpu]] #1 model")


@pytest.mark.parametrize(
    "command",
    [
        ["cost", "{a}"],
        ["report", "chargeback"],
        ["report", "run", "{a}", "--format", "json"],
        ["report", "run", "{a}", "--format", "md", "--cost"],
        ["compare", "{a}", "{b}"],
        ["compare", "{a}", "{b}", "--cost"],
    ],
    ids=" ".join,
)
def test_a_broken_rate_card_in_the_environment_is_refused_by_every_priced_report(
    command: list[str], world: dict[str, str], unchanged: None
) -> None:
    result = invoke(_fill(command, world), world, GPULEDGER_RATES=world["card"])
    assert_one_error(result, 1, "the rate card has problems", f"{world['card']}:6: [[gpu]] #1 price_per_hour")


def test_reports_without_cost_do_not_read_the_rate_card(world: dict[str, str], unchanged: None) -> None:
    result = invoke(["report", "run", short_id(RUN_A), "--format", "json", "--no-cost"], world,
                    GPULEDGER_RATES=world["card"])  # fmt: skip
    assert result.exit_code == 0, result.output


def test_serve_without_the_server_extra_names_it(
    world: dict[str, str], unchanged: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert_one_error(invoke(["serve"], world), 1, "gpuledger serve needs the [server] extra",
                     "pip install 'gpuledger[server]'")  # fmt: skip


def test_parquet_without_pyarrow_names_the_extra_and_writes_nothing(
    world: dict[str, str], unchanged: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    target = Path(world["root"]) / "run.parquet"
    result = invoke(["export", short_id(RUN_A), "--format", "parquet", "-o", str(target)], world)
    assert_one_error(result, 1, "pip install 'gpuledger[parquet]'")
    assert not target.exists()


@pytest.mark.parametrize("command", FORMAT_COMMANDS, ids=" ".join)
def test_contradicting_output_formats_are_a_usage_error(
    command: list[str], world: dict[str, str], unchanged: None
) -> None:
    other = "md" if command[:2] == ["report", "run"] else "table"  # a format the command has, not json
    result = invoke([*_fill(command, world), "--json", "--format", other], world)
    assert_one_error(result, 2, f"--json and --format {other}")


@pytest.mark.parametrize("command", [["runs"], ["import", "ultralytics", "{home}"]], ids=" ".join)
def test_a_label_without_a_value_is_a_usage_error(command: list[str], world: dict[str, str], unchanged: None) -> None:
    assert_one_error(invoke([*_fill(command, world), "--label", "novalue"], world), 2, "--label")


def test_an_existing_output_file_survives_a_failed_write(
    world: dict[str, str], unchanged: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = Path(world["root"]) / "keep.csv"
    target.write_text("the previous export\n")
    try:

        def disk_full(*_args: object, **_kw: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr("os.replace", disk_full)
        result = invoke(["export", short_id(RUN_A), "-o", str(target)], world)
        assert_one_error(result, 1, "No space left on device", "nothing was written")
        assert target.read_text() == "the previous export\n"
        assert [p.name for p in target.parent.glob(".keep.csv.*")] == []  # no temporary file left
    finally:
        target.unlink()


# Commands that write runs (or the schema, or an outbox) and so create the ledger they are given.
CREATING = {"agent", "db migrate", "import ultralytics", "recover", "run", "sync"}


@pytest.mark.parametrize("form", ["path", "url"])
@pytest.mark.parametrize("command", sorted(set(LEDGER_COMMANDS) - CREATING))
def test_a_mistyped_ledger_path_is_refused_and_nothing_is_created(
    command: str, form: str, world: dict[str, str], unchanged: None, tmp_path: Path
) -> None:
    missing = tmp_path / "ledgre.db"
    db = str(missing) if form == "path" else f"sqlite:///{missing}"
    args = [*command.split(), *_fill(LEDGER_COMMANDS[command], world), "--db", db]
    assert_one_error(invoke(args, world), 1, f"Error: no ledger at {missing}")
    assert list(tmp_path.iterdir()) == []  # no empty ledger (nor its -wal / -shm) left behind


def test_the_creating_commands_are_commands() -> None:
    assert CREATING.issubset(LEDGER_COMMANDS)


def test_import_still_creates_the_ledger_it_is_given(world: dict[str, str], tmp_path: Path) -> None:
    fresh = tmp_path / "new.db"
    result = invoke(["import", "ultralytics", world["home"], "--db", str(fresh)], world)
    assert_one_error(result, 1, "is not an Ultralytics run directory")  # home is none: one Error: line
    assert fresh.exists()  # but the ledger was made, as import writes runs


def test_import_of_a_missing_folder_is_a_usage_error(world: dict[str, str], tmp_path: Path) -> None:
    fresh = tmp_path / "new.db"
    result = invoke(["import", "ultralytics", str(tmp_path / "nope"), "--db", str(fresh)], world)
    assert_one_error(result, 2, "does not exist")
    assert not fresh.exists()


LABEL_MISTAKES = [
    (["--label", "a=1", "--label", "a=2"], "--label", "label 'a' is given twice"),
    (["--label", "k="], "--label", "label 'k' has an empty value"),
    (["--label", "k= "], "--label", "label 'k' has an empty value"),
]


@pytest.mark.parametrize(("options", "option", "message"), LABEL_MISTAKES, ids=lambda v: str(v))
@pytest.mark.parametrize("command", [["runs"], ["import", "ultralytics", "{home}"]], ids=" ".join)
def test_a_duplicate_or_empty_label_is_a_usage_error(
    command: list[str], options: list[str], option: str, message: str, world: dict[str, str], unchanged: None
) -> None:
    assert_one_error(invoke([*_fill(command, world), *options], world), 2, option, message)


@pytest.mark.parametrize(
    ("command", "option"),
    [(["runs"], "--project"), (["runs"], "--team"), (["runs"], "--user"), (["cost"], "--project"),
     (["report", "chargeback"], "--project")],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)  # fmt: skip
@pytest.mark.parametrize("value", ["", "  "], ids=["empty", "blank"])
def test_an_empty_filter_is_a_usage_error_not_no_match(
    command: list[str], option: str, value: str, world: dict[str, str], unchanged: None
) -> None:
    """An empty --project matches no run: "no run matches" (exit 0) would hide the typo."""
    assert_one_error(invoke([*command, option, value], world), 2, option, "is empty")


@pytest.mark.parametrize(
    ("options", "option", "message"),
    [
        *LABEL_MISTAKES,
        (["--team", ""], "--team", "is empty"),
        (["--project", "  "], "--project", "is empty"),
        (["--label", "team=vision", "--team", "nlp"], "--team", "contradict"),
    ],
    ids=lambda v: str(v),
)
def test_run_refuses_a_bad_label_before_the_command_starts(
    options: list[str], option: str, message: str, world: dict[str, str], unchanged: None
) -> None:
    marker = Path(world["root"]) / "command-ran"
    out = run_cli(["run", *options, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"], world)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and option in errors[0] and message in errors[0], out.stderr
    assert not marker.exists()  # COMMAND never started


def test_run_refuses_a_trace_that_is_not_there_before_the_command_starts(
    world: dict[str, str], unchanged: None
) -> None:
    """A mistyped --replay-gpus: not a run marked replayed with no GPU, but a usage error."""
    marker = Path(world["root"]) / "command-ran"
    argv = ["run", "--replay-gpus", "a100x2-exmaple", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    out = run_cli(argv, world)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--replay-gpus" in errors[0] and "a100x2-example" in errors[0], out.stderr
    assert not marker.exists()  # COMMAND never started


def test_recover_of_a_file_that_is_not_a_spooled_run_names_it_once(world: dict[str, str], unchanged: None) -> None:
    card = world["card"]  # any file that is not a spooled run
    result = invoke(["recover", card], world)
    assert_one_error(result, 1, f"Error: {card}: not a readable spool file")
    assert result.output.count(card) == 1
