"""`gpuledger run` end to end: real child processes, real ledger (SQLite and PostgreSQL)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_support import need_module
from e2e_helpers import GPULEDGER, cli_env, only_run, py, run_cli, runs_json, show_json

pytestmark = pytest.mark.slow

BURNER = textwrap.dedent(
    """
    import json, multiprocessing as mp, resource, sys, time

    def burn(seconds):
        end = time.process_time() + seconds
        x = 0
        while time.process_time() < end:
            x += 1

    if __name__ == "__main__":
        ctx = mp.get_context("fork")
        workers = [ctx.Process(target=burn, args=(1.2,)) for _ in range(2)]
        for w in workers:
            w.start()
        burn(0.4)
        for w in workers:
            w.join()
        me = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        total = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        with open(sys.argv[1], "w") as fh:
            json.dump({"cpu_s": total}, fh)
    """
)


def wait_for(condition: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
    """Poll ``condition`` until it holds; a generous deadline, never a guessed sleep."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {limit_s:.0f} s for {what}"
        time.sleep(0.1)


def flushed_intervals(env: dict[str, str]) -> int:
    """Intervals the ledger holds of the one run so far; 0 before its row is written (or while the
    ledger is busy): what a test polls for, never an error."""
    out = run_cli(["runs", "--json"], env)
    rows = json.loads(out.stdout) if out.returncode == 0 else []
    if len(rows) != 1:
        return 0
    shown = run_cli(["show", rows[0]["id"], "--json"], env)
    return int(json.loads(shown.stdout).get("intervals") or 0) if shown.returncode == 0 else 0


@pytest.fixture
def env(tmp_path: Path, ledger_url: str) -> dict[str, str]:
    return cli_env(tmp_path / "home", ledger_url)


def test_cpu_seconds_match_the_os_accounting_of_the_child_tree(tmp_path: Path, env: dict[str, str]) -> None:
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    truth_file = tmp_path / "truth.json"
    out = run_cli(
        ["run", "--interval", "0.5", "--project", "acct", "--", sys.executable, str(script), str(truth_file)], env
    )
    assert out.returncode == 0, out.stderr.decode()
    truth = json.loads(truth_file.read_text())["cpu_s"]
    run = only_run(env)
    assert run["status"] == "succeeded"
    assert run["labels"]["project"] == "acct"
    assert truth > 2.5  # the workload really burnt CPU in three processes
    # The interpreter's own exit after writing the truth file costs a few ms more: within 2 %.
    assert run["cpu_seconds"] == pytest.approx(truth, rel=0.02)


PROGRESS = textwrap.dedent(
    """
    import json, sys, time
    log = []
    while time.process_time() < 4.0:  # burn 4 s of CPU (longer on a busy machine), noting it as it goes
        t = time.time() + 0.1
        while time.time() < t:
            pass
        log.append([time.time(), time.process_time()])
    json.dump(log, open(sys.argv[1], "w"))
    time.sleep(0.6)
    """
)


def test_cpu_seconds_while_the_command_runs_follow_its_own_accounting(tmp_path: Path, env: dict[str, str]) -> None:
    # The exact total comes from wait4 at the end; the intervals recorded *during* the run come
    # from reading /proc. Each interval's cumulative CPU must match what the process itself saw.
    script, progress = tmp_path / "progress.py", tmp_path / "progress.json"
    script.write_text(PROGRESS)
    out = run_cli(["run", "--interval", "0.5", "--", sys.executable, str(script), str(progress)], env)
    assert out.returncode == 0, out.stderr.decode()
    log = json.loads(progress.read_text())
    export = run_cli(["export", only_run(env)["id"], "--format", "jsonl"], env).stdout.splitlines()
    hosts = sorted((json.loads(line) for line in export if b'"host"' in line), key=lambda r: r["t0"])
    cumulative, checked = 0.0, 0
    for row in hosts:
        cumulative += row["cpu_s"]
        truth = [cpu for t, cpu in log if t <= row["t1"]]
        if not truth or row["t1"] > log[-1][0] - 0.3:
            continue  # before the first note, or near the end (the final credit lands there)
        checked += 1
        assert cumulative == pytest.approx(truth[-1], abs=0.35), (row["t1"] - log[0][0], cumulative, truth[-1])
    assert checked >= 4


def test_memory_grower_peak_rss_is_recorded(env: dict[str, str]) -> None:
    code = (
        "import time\nblocks=[]\nfor _ in range(8):\n"
        "    blocks.append(bytearray(25*2**20)); time.sleep(0.15)\ntime.sleep(0.6)"
    )
    out = run_cli(["run", "--interval", "0.5", "--", *py(code)], env)
    assert out.returncode == 0, out.stderr.decode()
    run = only_run(env)
    # 8 x 25 MiB held, plus the interpreter (~10-30 MiB): from below and from above
    assert 200 * 2**20 <= run["peak_rss_bytes"] <= 300 * 2**20


def test_exit_code_output_and_log_are_passed_through(env: dict[str, str]) -> None:
    code = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(7)"
    out = run_cli(["run", "--", *py(code)], env)
    assert out.returncode == 7
    assert b"to stdout" in out.stdout
    assert b"to stderr" in out.stderr
    run = only_run(env)
    assert run["status"] == "failed" and run["exit_code"] == 7
    log = run_cli(["logs", run["id"][:8]], env)
    assert b"to stdout" in log.stdout and b"to stderr" in log.stdout


def test_child_killed_by_sigkill_exits_137_and_is_marked_killed(env: dict[str, str]) -> None:
    out = run_cli(["run", "--", *py("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")], env)
    assert out.returncode == 128 + signal.SIGKILL
    run = only_run(env)
    assert run["status"] == "killed"
    assert "SIGKILL" in run["status_reason"]


def test_sigint_is_forwarded_to_the_command(tmp_path: Path, env: dict[str, str]) -> None:
    marker = tmp_path / "got-sigint"
    code = textwrap.dedent(
        f"""
        import signal, sys, time
        def bye(*_):
            open({str(marker)!r}, "w").write("yes")
            sys.exit(3)
        signal.signal(signal.SIGINT, bye)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [*GPULEDGER, "run", "--", *py(code)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert marker.read_text() == "yes"
    assert only_run(env)["status"] == "failed"


def test_kill_9_of_gpuledger_leaves_the_command_running_with_its_full_log(tmp_path: Path, env: dict[str, str]) -> None:
    done, go = tmp_path / "done", tmp_path / "go"
    code = textwrap.dedent(
        f"""
        import os, time
        for i in range(15):
            print(f"line {{i}}", flush=True)
            time.sleep(0.1)
        while not os.path.exists({str(go)!r}):  # runs on until gpuledger has been killed
            time.sleep(0.05)
        for i in range(15, 30):
            print(f"line {{i}}", flush=True)
        open({str(done)!r} + ".tmp", "w").write("finished")
        os.replace({str(done)!r} + ".tmp", {str(done)!r})  # atomic: the test never sees it half-written
        """
    )
    proc = subprocess.Popen(
        [*GPULEDGER, "run", "--interval", "0.5", "--", *py(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout.readline().startswith(b"line 0")
    wait_for(lambda: flushed_intervals(env) >= 1, "a flush of the run's first interval")
    proc.kill()
    proc.wait()
    go.touch()
    wait_for(done.exists, "the command to finish without gpuledger")
    assert done.read_text() == "finished"  # CMD ran to completion without gpuledger
    run = only_run(env)
    assert run["status"] == "lost"
    assert run["intervals"] >= 1  # usage up to the last flush

    def logged() -> list[int]:
        log = run_cli(["logs", run["id"]], env).stdout.decode()
        return [int(n) for n in re.findall(r"line (\d+)", log)]

    wait_for(lambda: len(logged()) >= 30, "the relay to write the last line")
    assert logged() == list(range(30))


def test_eight_concurrent_runs_lose_no_interval(env: dict[str, str]) -> None:
    procs = [
        subprocess.Popen(
            [*GPULEDGER, "run", "--interval", "0.5", "--name", f"r{i}", "--", *py("import time; time.sleep(2.5)")],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i in range(8)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    rows = runs_json(env)
    assert sorted(r["name"] for r in rows) == [f"r{i}" for i in range(8)]
    for row in rows:
        run = show_json(row["id"], env)
        export = run_cli(["export", row["id"], "--format", "jsonl"], env)
        hosts = [json.loads(line) for line in export.stdout.splitlines() if b'"host"' in line]
        seqs = sorted(h["seq"] for h in hosts)
        assert seqs == list(range(len(seqs)))  # no gap: nothing was lost under contention
        assert len(seqs) >= 1
        # The intervals tile the run: no hole between consecutive intervals, up to its end.
        hosts.sort(key=lambda h: h["seq"])
        for a, b in itertools.pairwise(hosts):
            assert b["t0"] == pytest.approx(a["t1"], abs=1e-6)
        assert hosts[-1]["t1"] == pytest.approx(run["ended_at_epoch"], abs=1.0)
        assert run["status"] == "succeeded"


def test_no_gpu_run_says_why(env: dict[str, str]) -> None:
    out = run_cli(["run", "--", *py("pass")], env)
    assert out.returncode == 0
    run = only_run(env)
    assert run["gpus"] == []
    assert run["gpu_note"]
    assert run["busy_gpu_hours"] in (None, 0)
    assert run["gpu_note"].split()[0].lower() in out.stderr.decode().lower()


def test_secrets_in_command_and_log_are_redacted(env: dict[str, str]) -> None:
    secret = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    code = f"print('token is {secret}')"
    out = run_cli(["run", "--", *py(code), "--password", "hunter2", "lr0=0.01"], env)
    assert out.returncode == 0
    assert secret.encode() in out.stdout  # the user's own terminal sees the real output
    run = only_run(env)
    command = " ".join(run["command"])
    assert secret not in command and "hunter2" not in command and "lr0=0.01" in command
    log = run_cli(["logs", run["id"]], env).stdout
    assert secret.encode() not in log and b"token is" in log


def test_command_not_found_exits_127(env: dict[str, str]) -> None:
    out = run_cli(["run", "--", "definitely-not-a-command-xyz"], env)
    assert out.returncode == 127
    assert b"definitely-not-a-command-xyz" in out.stderr


def test_track_api_meters_the_current_process(tmp_path: Path, env: dict[str, str]) -> None:
    code = textwrap.dedent(
        """
        import json, sys, time, gpuledger
        with gpuledger.track(project="api", interval=0.5, no_gpu=True) as run:
            end = time.process_time() + 0.8
            while time.process_time() < end:
                pass
            run.log_metric("loss", 0.5, epoch=0)
        print(json.dumps({"id": run.id, "cpu": run.summary["cpu_seconds"]}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    result = json.loads(out.stdout.splitlines()[-1])
    run = show_json(result["id"], env)
    assert run["status"] == "succeeded" and run["labels"]["project"] == "api"
    # The process's own 0.8 s (process_time, nanoseconds) to the microsecond getrusage counts in,
    # not in /proc/<pid>/stat's whole clock ticks (up to 20 ms short).
    assert run["cpu_seconds"] >= 0.8 - 1e-3


def test_export_formats_share_the_documented_columns(tmp_path: Path, env: dict[str, str]) -> None:
    pq = need_module("pyarrow.parquet", "pip install 'gpuledger[parquet]'")
    from gpuledger.reports.run.export import COLUMN_NAMES

    assert run_cli(["run", "--interval", "0.5", "--", *py("import time; time.sleep(1.2)")], env).returncode == 0
    run_id = runs_json(env)[0]["id"]
    csv_text = run_cli(["export", run_id, "--format", "csv"], env).stdout.decode()
    assert tuple(csv_text.splitlines()[0].split(",")) == COLUMN_NAMES
    target = tmp_path / "iv.parquet"
    assert run_cli(["export", run_id, "--format", "parquet", "-o", str(target)], env).returncode == 0
    table = pq.read_table(target)
    assert tuple(table.column_names) == COLUMN_NAMES
    cpu = sum(v for v in table.column("cpu_s").to_pylist() if v is not None)
    assert cpu == pytest.approx(show_json(run_id, env)["cpu_seconds"], rel=1e-9, abs=1e-9)


def test_unknown_run_is_a_clear_error(env: dict[str, str]) -> None:
    from gpuledger.store import Ledger

    Ledger(env["GPULEDGER_DB"]).close()  # a ledger with no run: the run is what is unknown
    out = run_cli(["show", "ffffffff"], env)
    assert out.returncode != 0
    assert b"ffffffff" in out.stderr
    assert b"Traceback" not in out.stderr


@pytest.mark.skipif(not os.path.exists("/dev/ptmx"), reason="no pseudo-terminals here")
def test_colours_survive_when_stdout_is_a_terminal(tmp_path: Path, env: dict[str, str]) -> None:
    import pty

    code = "import sys; print('tty' if sys.stdout.isatty() else 'pipe'); print('\\x1b[31mred\\x1b[0m\\rover')"
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - child
        os.execve(sys.executable, [sys.executable, "-m", "gpuledger", "run", "-q", "--", *py(code)], env)
    chunks = []
    while True:
        try:
            data = os.read(fd, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    output = b"".join(chunks)
    assert os.WEXITSTATUS(status) == 0
    assert b"tty" in output  # CMD saw a terminal, so it keeps its colours and progress bars
    assert b"\x1b[31mred\x1b[0m\rover" in output


def test_unreachable_ledger_keeps_the_run_in_a_spool_that_recover_writes(tmp_path: Path) -> None:
    dead = "postgresql://nobody@127.0.0.1:1/gone"
    env = cli_env(tmp_path / "home", dead)
    out = run_cli(["run", "--interval", "0.5", "--", *py("import time; print('trained'); time.sleep(1.2)")], env)
    assert out.returncode == 0 and b"trained" in out.stdout  # the training never noticed
    assert b"gpuledger recover" in out.stderr
    good = f"sqlite:///{tmp_path}/ledger.db"
    recovered = run_cli(["recover", "--db", good], env)
    assert recovered.returncode == 0, recovered.stderr.decode()
    env["GPULEDGER_DB"] = good
    run = only_run(env)
    assert run["status"] == "succeeded" and run["intervals"] >= 2
    assert run_cli(["logs", run["id"]], env).stdout.strip() == b"trained"
    assert not list((tmp_path / "home" / "spool").glob("*.json"))  # recovered once, then gone


def test_markup_and_escape_sequences_in_names_reach_the_terminal_as_plain_text(env: dict[str, str]) -> None:
    name = "[red]boom[/red] \x1b[2J"
    assert run_cli(["run", "--name", name, "--project", "[bold]p", "--", *py("pass")], env).returncode == 0
    table = run_cli(["runs"], env).stdout.decode()
    assert "[red]boom[/red]" in table and "[bold]p" in table  # shown as typed, not interpreted
    assert "\x1b[2J" not in table  # a name cannot clear the reader's screen


def test_a_short_command_still_has_its_memory_measured(env: dict[str, str]) -> None:
    # The first reading comes a quarter second in: a one-second job is not reported as 0 B.
    code = "import time\nblock = bytearray(120 * 2**20)\ntime.sleep(1.5)"
    assert run_cli(["run", "--", *py(code)], env).returncode == 0
    assert 120 * 2**20 <= only_run(env)["peak_rss_bytes"] <= 200 * 2**20


def test_a_small_command_is_not_given_the_recorders_memory(tmp_path: Path, env: dict[str, str]) -> None:
    # A shell waiting in `sleep`s holds a few MiB. wait4's ru_maxrss for it also counts the image
    # it was forked from (gpuledger's own tens of MiB, before exec): the readings that saw it are
    # its peak. It runs until a flushed interval shows a reading saw it, however slow the machine.
    go = tmp_path / "go"
    waiter = 'while [ ! -e "$0" ]; do sleep 0.05; done'
    proc = subprocess.Popen([*GPULEDGER, "run", "--interval", "0.5", "--", "sh", "-c", waiter, str(go)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_for(lambda: flushed_intervals(env) >= 1, "a flushed reading of the command")
    finally:
        go.touch()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert 0 < only_run(env)["peak_rss_bytes"] <= 16 * 2**20


def test_a_command_too_short_to_sample_still_has_its_peak_memory(env: dict[str, str]) -> None:
    # It ends before the first reading: its peak comes from wait4's ru_maxrss, not a made-up 0.
    code = "block = bytearray(150 * 2**20)"
    assert run_cli(["run", "--", *py(code)], env).returncode == 0
    assert 150 * 2**20 <= only_run(env)["peak_rss_bytes"] <= 250 * 2**20
