"""Throughput of the output relay with redaction, beside `cat` and `tee`, and what a chatty command
costs under `gpuledger run` (issue 11).

    python benchmarks/relay_throughput.py [--mb 50] [--rounds 3] [--output mix|keywords|assignments] [--skip-run]

The output (generated once, seeded; `--mb` of it) is what a chatty training prints. By bytes:
59 % Ultralytics epochs (a progress row redrawn with \\r some 300 times, coloured headers, the
validation rows), 14 % LLM-style step lines (`step N | loss ... | tokens/s ...`), 9 % HF-style
tqdm bars with a postfix, 17 % long lines (config dumps of 30-150 KB whose keys hold `key` and
`token`, tensor dumps of 40-160 KB), 2 % log lines (paths, URLs, `----` rules, colour codes), and
a few secrets (HF tokens, database URLs with a password, Authorization headers, W&B keys, a token
cut by a colour code). `--output keywords` puts rule keywords that are no secret on every line
(`tokens/s`, `key_dim`, `--`, `passed`); `--output assignments` is logfmt whose fields look like
secret assignments on every line (`request_key=... token_count=...`): every line then goes through
the rules' own regexes, the worst case.

Readers, each fed the same bytes by `cat FILE` through a pipe, then through a raw pty:
  cat    `cat > /dev/null`
  tee    `tee COPY > /dev/null`: a plain copy to a file, what the relay does without redaction
  relay  gpuledger's output relay (recorder/relay.pump, the loop of the forked relay process):
         the bytes to /dev/null unchanged, the redacted copy appended to a log file
Each figure is MB of output per second of the reader's own CPU time (wait4 for cat and tee, the
pump's process time for the relay), the median of --rounds rounds with the readers alternated. On
a shared machine CPU time, not wall time, says what the reader costs.

Then the whole process, end to end, on pipes (stdout on /dev/null) and on a raw pty: the printer
(`python -c <print the file in 8 KiB writes>`) bare, piped into `tee COPY` (the peer: a plain copy
kept on disk, `sh -c 'printer | tee COPY'`), and under `gpuledger run -q --db sqlite:///...`; and
`python -c pass` bare and under `gpuledger run`, for gpuledger's fixed cost. All alternated in each
round, after one untimed `gpuledger run` that creates the ledger (a once-per-ledger cost that made
the first round's run the slowest) and prints the output, so the relay's Hyperscan databases are in
the cache (core/hyperscan_cache.py: compiled once per machine, as any earlier run leaves them).
CPU time is wait4 of the top process (everything it reaped: gpuledger, its relay, CMD).
Printed per variant: medians of wall and CPU, and three throughputs:
  end to end   MB / CPU of the whole `gpuledger run` of the printer (CMD and fixed cost included)
  output path  MB / (that CPU - the printer's own CPU - gpuledger's fixed cost), i.e. what each MB
               of output costs gpuledger (relay, redaction, storing the log, reading it at the end)
  tee          MB / (CPU of `printer | tee COPY` - the printer's own CPU)
min / median / max over the rounds, each round's figures from the same round's runs; and what is
kept on disk per run (the ledger's growth and the logs folder).

The gpuledger package the runs import is byte-compiled first and the runs get no
PYTHONDONTWRITEBYTECODE (as benchmarks/wrapper_overhead.py does): an installed gpuledger runs from
bytecode, and a dev shell's PYTHONDONTWRITEBYTECODE=1 would make every run compile the ~40
modules the end of a chatty run imports (about 0.04 s of CPU that is no cost of gpuledger's).
To measure another tree, run this script with PYTHONPATH=TREE/src: that tree is compiled and run.

`--floor`: instead, what the parts a 50 MB run cannot do without cost on this machine, each alone in
this process on the same bytes (CPU time, best of --rounds): compressing the log as it is stored
(store/log_codec.py, ISA-L; zstd's and lz4's fastest levels beside it where installed), its
sha256, one Hyperscan pass of the redaction's line filter and counting the line ends (the least a
relay that redacts and indexes can do), the redaction and the line index as the relay runs them,
and the SQLite write of the stored log; with `gpuledger run -q -- python -c pass` (the fixed
cost) and `tee`'s copy, it says how far below the 0.5 s that 100 MB/s allows a run can get here.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pty
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tty
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import gpuledger_executable, machine_line, source_state, version

BLOCKS = "\u2588\u258f\u258e\u258d\u258c\u258b\u258a\u2589"

RELAY = (
    "import json, os, sys, time\n"
    "from gpuledger.core.redaction.redact import Redactor\n"
    "from gpuledger.recorder.relay import pump\n"
    "redactor = Redactor.default()\n"
    "log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)\n"
    "t0 = time.process_time()\n"
    "pump({0: 1}, log, redactor.stream)\n"
    "print(json.dumps({'cpu': time.process_time() - t0}), file=sys.stderr)\n"
)
PRINTER = "import sys\nf = open(sys.argv[1], 'rb')\nw = sys.stdout.buffer.write\nwhile b := f.read(8192):\n    w(b)\n"


def _bar(frac: float, width: int = 10) -> bytes:
    full = int(frac * width)
    rest = int((frac * width - full) * 8)
    s = BLOCKS[0] * full + (BLOCKS[8 - rest] if rest and full < width else "")
    return s.ljust(width).encode()


# fmt: off
def realistic_output(size: int, seed: int = 1) -> bytes:
    """Training-like output of ``size`` bytes (see the module docstring for what it holds)."""
    rng = random.Random(seed)
    parts: list[bytes] = []
    total = 0
    step = epoch = 0

    def emit(b: bytes) -> None:
        nonlocal total
        parts.append(b)
        total += len(b)

    while total < size:
        kind = rng.random()
        if kind < 0.45:  # an Ultralytics epoch: one progress row redrawn ~300 times
            epoch += 1
            emit(b"\n\x1b[1m      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\x1b[0m\n")
            n = 300
            for i in range(n + 1):
                emit(
                    b"\r%11s %10s %10.4g %10.4g %10.4g %10d %10d: %3d%%|%s| %d/%d [00:%02d<00:%02d, %5.2fit/s]"
                    % (b"%d/300" % epoch, b"%.3gG" % (3 + rng.random()), 1 + rng.random(), 2 * rng.random(),
                       1 + rng.random(), rng.randint(20, 250), 640, 100 * i // n, _bar(i / n), i, n, i % 60,
                       (n - i) % 60, 8 + 4 * rng.random())
                )
            emit(b"\n                 Class     Images  Instances      Box(P          R      mAP50  mAP50-95): 100%|"
                 + _bar(1.0) + b"| 16/16 [00:02<00:00,  7.10it/s]\n")
            emit(b"                   all        128        929      %.3g      %.3g      %.3g      %.3g\n"
                 % tuple(rng.random() for _ in range(4)))
        elif kind < 0.65:  # an LLM trainer: one line per step
            for _ in range(200):
                step += 1
                emit(b"step %6d | loss %.4f | lr %.2e | tokens/s %6d | grad_norm %.3f | mfu %.1f%% | time %.1fms\n"
                     % (step, 2 + rng.random(), 3e-4 * rng.random(), rng.randint(30000, 60000), rng.random(),
                        30 + 20 * rng.random(), 80 + 40 * rng.random()))
        elif kind < 0.80:  # HF-style tqdm with a postfix
            n = 200
            for i in range(n + 1):
                emit(b"\r %3d%%|%s| %d/%d [01:%02d<02:%02d,  %.2fit/s, loss=%.3f, lr=%.1e]"
                     % (100 * i // n, _bar(i / n), i, n, i % 60, (n - i) % 60, 5 + rng.random(),
                        2 * rng.random(), 3e-5 * rng.random()))
            emit(b"\n")
        elif kind < 0.93:  # log lines: paths, URLs, rules, colours
            for _ in range(40):
                emit(rng.choice([
                    b"[2026-11-30 12:%02d:%02d,%03d][trainer][INFO] - Saving model checkpoint to "
                    b"/scratch/runs/exp12/checkpoint-%d\n" % (rng.randint(0, 59), rng.randint(0, 59),
                                                            rng.randint(0, 999), step),
                    b"Downloading https://github.com/ultralytics/assets/releases/download/v8.2.0/yolov8n.pt to "
                    b"'yolov8n.pt'...\n",
                    b"\x1b[34m\x1b[1mtrain: \x1b[0mScanning /data/coco/labels/train2017.cache... 117266 images, "
                    b"1021 backgrounds, 0 corrupt: 100%|" + _bar(1.0) + b"| 118287/118287 [00:00<?, ?it/s]\n",
                    b"-" * 100 + b"\n",
                    b"WARNING: the tokenizer has a pad_token but no eos_token; using pad_token_id=0 for open-end "
                    b"generation. Passing --max-new-tokens is recommended.\n",
                    b"\x1b[33mwarning\x1b[0m: key 'model.layers.%d.mlp.gate_proj.weight' was not found in the "
                    b"checkpoint; initialising it randomly\n" % rng.randint(0, 31),
                    b"  %-40s %12d  %s\n" % (b"model.%d.conv.weight" % rng.randint(0, 99), rng.randint(1, 10**6),
                                             b"[64, 3, 3, 3]"),
                ]))
        elif kind < 0.985:  # a long line: a config or a tensor dumped on one line
            if rng.random() < 0.5:
                items = b", ".join(b'"layer_%d_%s": %.6f' % (i, rng.choice([b"scale", b"key_dim", b"token_mix"]),
                                                             rng.random()) for i in range(rng.randint(500, 3000)))
                emit(b"config: {" + items + b"}\n")
            else:
                values = b", ".join(b"%.4f" % (rng.random() - 0.5) for _ in range(rng.randint(5000, 20000)))
                emit(b"tensor([" + values + b"])\n")
        else:  # secrets, each on its own line
            emit(rng.choice([
                b"export HF_TOKEN=hf_" + bytes(rng.choice(b"ABCDEFGHabcdefgh0123456789") for _ in range(34)) + b"\n",
                b"connecting to postgresql://ml:s3cr3t-%d@db.internal:5432/runs\n" % rng.randint(0, 999),
                b"curl -H 'Authorization: Bearer tok%08d' https://api.example.com/v1/jobs\n" % rng.randint(0, 10**8),
                b"wandb: WANDB_API_KEY=%040x\n" % rng.getrandbits(160),
                b"$ python train.py --epochs 100 --api-key %032x --batch 64\n" % rng.getrandbits(128),
                b"\x1b[31mHF_TOKEN=hf_AbCdEfGh\x1b[0mIjKlMnOpQrStUvWxYz012345\n",
            ]))
    return b"".join(parts)[:size]


# fmt: on


def keyword_output(size: int, seed: int = 2) -> bytes:
    """Every line holds rule keywords that are no secret: tokens/s, key_dim, a -- rule, passed."""
    rng = random.Random(seed)
    line = b"\rstep %6d | tokens/s %6d | key_dim 64 | checks passed -- loss %.4f | %s"
    out = b"".join(line % (i, rng.randint(1000, 9999), rng.random(), _bar(rng.random())) for i in range(size // 70))
    return (out + b"\nexport HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567\n")[:size]


def assignment_output(size: int, seed: int = 3) -> bytes:
    """logfmt lines whose fields look like secret assignments (request_key=, token_count=): every
    line must go through the rules' own regexes. The worst case."""
    rng = random.Random(seed)
    line = b'ts=2026-11-30T12:00:%02d level=info request_key=%08x token_count=%d msg="batch done"\n'
    return b"".join(line % (i % 60, rng.getrandbits(32), rng.randint(1, 999)) for i in range(size // 80))[:size]


def _wait(proc: subprocess.Popen[bytes]) -> float:
    _, _, ru = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return ru.ru_utime + ru.ru_stime


def _feed(path: str, on_pty: bool) -> tuple[int, int]:
    """(fd for the reader, fd for the writer): a pipe, or a raw pty (bytes passed as written)."""
    if on_pty:
        master, slave = pty.openpty()
        tty.setraw(slave)
        return master, slave
    r, w = os.pipe()
    return r, w


def measure(reader: str, path: str, size: int, on_pty: bool, tmp: str) -> float:
    """MB/s of one reader on the file's bytes: MB per second of the reader's CPU time."""
    read_fd, write_fd = _feed(path, on_pty)
    copy = os.path.join(tmp, f"copy-{reader}.out")
    if os.path.exists(copy):
        os.unlink(copy)
    devnull = subprocess.DEVNULL
    if reader == "cat":
        proc = subprocess.Popen(["cat"], stdin=read_fd, stdout=devnull, stderr=devnull)
    elif reader == "tee":
        proc = subprocess.Popen(["tee", copy], stdin=read_fd, stdout=devnull, stderr=devnull)
    else:
        proc = subprocess.Popen(
            [sys.executable, "-c", RELAY, copy], stdin=read_fd, stdout=devnull, stderr=subprocess.PIPE
        )
    writer = subprocess.Popen(["cat", path], stdout=write_fd)
    os.close(read_fd)
    os.close(write_fd)
    _wait(writer)
    if reader == "relay":
        err = proc.communicate()[1].decode()
        cpu = float(err.strip().splitlines()[-1].split(":")[1].strip(" }"))
    else:
        cpu = _wait(proc)
    if reader != "cat" and os.path.getsize(copy) < size * 0.9:
        raise SystemExit(f"{reader} wrote {os.path.getsize(copy)} of {size} bytes")
    return size / 1e6 / cpu


def whole_run(argv: list[str], env: dict[str, str], on_pty: bool) -> tuple[float, float]:
    """(wall s, CPU s of the process and everything it reaped)."""
    if on_pty:
        master, slave = pty.openpty()
        tty.setraw(slave)
        drained = threading.Thread(target=_drain, args=(master,), daemon=True)
        drained.start()
        out = slave
    else:
        out = subprocess.DEVNULL
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    cpu = _wait(proc)
    wall = time.monotonic() - t0
    if on_pty:
        os.close(slave)
        drained.join(30)
    return wall, cpu


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 1 << 16):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def compile_package() -> str:
    """Byte-compile the gpuledger package the runs import (what pip install does for a wheel)."""
    spec = importlib.util.find_spec("gpuledger")
    assert spec is not None and spec.submodule_search_locations, "gpuledger is not importable here"
    folder = next(iter(spec.submodule_search_locations))
    subprocess.run([sys.executable, "-m", "compileall", "-q", folder], check=True, stdout=subprocess.DEVNULL)
    return folder


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=50.0, help="MB of output (default 50)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each measurement (default 3)")
    ap.add_argument("--output", choices=["mix", "keywords", "assignments"], default="mix", help="what is printed")
    ap.add_argument("--skip-run", action="store_true", help="only the readers, not gpuledger run")
    ap.add_argument("--floor", action="store_true", help="only the unavoidable parts' CPU, each alone")
    args = ap.parse_args()
    size = int(args.mb * 1e6)
    exe = gpuledger_executable()
    print(f"# {machine_line()}; gpuledger {version('gpuledger')} ({exe})\n# {source_state()}")
    with tempfile.TemporaryDirectory(prefix="gpl-relay-") as tmp:
        path = os.path.join(tmp, "output.bin")
        make = {"mix": realistic_output, "keywords": keyword_output, "assignments": assignment_output}[args.output]
        data = make(size)
        with open(path, "wb") as fh:
            fh.write(data)
        print(f"# output: {size / 1e6:.0f} MB, {args.output}\n")
        if args.floor:
            floor(data, path, tmp, args.rounds)
            return
        del data

        readers = ("cat", "tee", "relay")
        got: dict[tuple[str, bool], list[float]] = {}
        for r in range(args.rounds):
            for on_pty in (False, True):
                order = readers if r % 2 == 0 else readers[::-1]
                for reader in order:
                    got.setdefault((reader, on_pty), []).append(measure(reader, path, size, on_pty, tmp))
        print("| reader | pipe, MB/s | pty, MB/s |\n|---|---:|---:|")
        med = {k: statistics.median(v) for k, v in got.items()}
        names = {"cat": "`cat`", "tee": "`tee FILE`", "relay": "gpuledger relay with redaction"}
        for reader in readers:
            print(f"| {names[reader]} | {med[(reader, False)]:,.0f} | {med[(reader, True)]:,.0f} |")
        print(
            f"| relay / cat | {med[('relay', False)] / med[('cat', False)]:.2f} | "
            f"{med[('relay', True)] / med[('cat', True)]:.2f} |"
        )
        spread = {k: (min(v), max(v)) for k, v in got.items() if k[0] == "relay"}
        print(
            f"\nrelay spread over rounds: pipe {spread[('relay', False)][0]:.0f}-{spread[('relay', False)][1]:.0f}, "
            f"pty {spread[('relay', True)][0]:.0f}-{spread[('relay', True)][1]:.0f} MB/s"
        )
        if args.skip_run:
            return

        home = os.path.join(tmp, "home")
        db = os.path.join(tmp, "ledger.db")
        env = {**os.environ, "GPULEDGER_HOME": home}
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # from bytecode, as an installed gpuledger runs
        print(f"\n# bytecode compiled for {compile_package()}; the runs' environment has no PYTHONDONTWRITEBYTECODE")
        copy = os.path.join(tmp, "tee-copy.out")
        variants = {
            "bare": [sys.executable, "-c", PRINTER, path],
            "tee": ["sh", "-c", '"$0" -c "$1" "$2" | tee "$3"', sys.executable, PRINTER, path, copy],
            "run": [exe, "run", "-q", "--db", f"sqlite:///{db}", "--", sys.executable, "-c", PRINTER, path],
            "pass": [sys.executable, "-c", "pass"],
            "run-pass": [exe, "run", "-q", "--db", f"sqlite:///{db}", "--", sys.executable, "-c", "pass"],
        }
        # The first gpuledger run creates the ledger (schema, migrations) and the first chatty one
        # fills the Hyperscan cache: once per ledger and per machine, not a cost of output, so an
        # untimed run does both before the rounds.
        subprocess.run(variants["run"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        mb = size / 1e6
        print(
            "\n| whole process | bare printer wall / CPU | `printer \\| tee` wall / CPU | `gpuledger run` wall / CPU "
            "| fixed cost (`run -- python -c pass`) CPU | end to end, MB/s | output path, MB/s | tee, MB/s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        runs = 1  # the untimed run that created the ledger (it holds a log too)
        for on_pty in (False, True):
            timed: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
            for r in range(args.rounds):
                names = list(variants)
                names = names[r % len(names) :] + names[: r % len(names)]  # a different order each round
                for name in names:
                    timed[name].append(whole_run(variants[name], env, on_pty))
            runs += 2 * args.rounds
            cpu = {k: [c for _, c in v] for k, v in timed.items()}
            fixed = [rp - p for rp, p in zip(cpu["run-pass"], cpu["pass"], strict=True)]
            e2e = [mb / c for c in cpu["run"]]
            path_ = [mb / max(1e-9, c - b - f) for c, b, f in zip(cpu["run"], cpu["bare"], fixed, strict=True)]
            tee = [mb / max(1e-9, t - b) for t, b in zip(cpu["tee"], cpu["bare"], strict=True)]

            def med(pairs: list[tuple[float, float]]) -> str:
                w, c = (statistics.median(x) for x in zip(*pairs, strict=True))
                return f"{w:.2f} s / {c:.2f} s"

            def spread(xs: list[float]) -> str:
                return f"{min(xs):.0f} / **{statistics.median(xs):.0f}** / {max(xs):.0f}"

            print(
                f"| {'pty' if on_pty else 'pipes (stdout on /dev/null)'} | {med(timed['bare'])} "
                f"| {med(timed['tee'])} | {med(timed['run'])} "
                f"| {statistics.median(fixed):.2f} s | {spread(e2e)} | {spread(path_)} | {spread(tee)} |"
            )
        print("\nthroughputs: min / median / max over the rounds, MB per CPU-second")
        ledger_b = _size(db) + _size(db + "-wal")
        print(
            f"\nkept on disk: ledger {ledger_b / 1e6:.1f} MB for {runs} runs "
            f"(the printer's {args.rounds * 2 + 1} runs hold the logs; the log cap is 64 MiB), "
            f"logs folder {_size(os.path.join(home, 'logs')) / 1e6:.1f} MB"
        )


def _best(rounds: int, work: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        work()
        best = min(best, time.process_time() - t0)
    return best


def _pieces(data: bytes, size: int = 128 << 10) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _sqlite_store(packed: bytes, path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    with sqlite3.connect(path, isolation_level=None) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE logs (run_id TEXT PRIMARY KEY, data BLOB)")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO logs VALUES ('r', ?)", (packed,))
        conn.execute("COMMIT")
    conn.close()


def _relay_parts(pieces: list[bytes]) -> tuple[Callable[[], object], Callable[[], object]]:
    from gpuledger.core.redaction.redact import Redactor
    from gpuledger.core.training.lineindex import LineIndexer

    redactor = Redactor.default()

    def redact() -> None:
        stream = redactor.stream()
        for piece in pieces:
            stream.feed(piece)
        stream.flush()

    def index() -> None:
        indexer = LineIndexer()
        for piece in pieces:
            indexer.feed(piece)
        if indexer.close() is None:
            raise SystemExit("the line index was dropped: Hyperscan is missing here")

    return redact, index


def floor(data: bytes, path: str, tmp: str, rounds: int) -> None:
    """The --floor table (see the module doc)."""
    import hashlib

    from gpuledger.core.redaction.redact import Redactor
    from gpuledger.store import log_codec

    pieces = _pieces(data)
    finder = Redactor.default()._line_filter.match_ends()
    if finder is None:
        raise SystemExit("no Hyperscan here: the relay's line filter falls back to Python's re")
    packed = log_codec.encode(data)
    redact, index = _relay_parts(pieces)
    rows = [
        ("compress the log (store/log_codec.py, as stored)", _best(rounds, lambda: log_codec.encode(data))),
        ("its sha256", _best(rounds, lambda: hashlib.sha256(data).digest())),
        (
            "one Hyperscan pass of the line filter + counting line ends",
            _best(rounds, lambda: [(finder(p), p.count(b"\n")) for p in pieces]),
        ),
        ("SQLite: write the stored log (WAL, one commit)", _best(rounds, lambda: _sqlite_store(packed, f"{tmp}/f.db"))),
    ]
    floor_s = sum(cpu for _, cpu in rows)
    rows += [
        ("the relay's redaction as it runs (LineRedactor, 128 KiB pieces)", _best(rounds, redact)),
        ("the relay's line index as it runs (LineIndexer)", _best(rounds, index)),
    ]
    others = []
    for name, compress in _other_codecs():
        others.append((f"beside it: {name}", _best(rounds, lambda c=compress: c(data))))
    print(f"| part, {len(data) / 1e6:.0f} MB, best of {rounds} | CPU |\n|---|---:|")
    for name, cpu in rows + others:
        print(f"| {name} | {cpu:.3f} s |")
    print(f"\nthe first four together: {floor_s:.3f} s (stored {len(packed) / 1e6:.1f} MB)")
    env = {**os.environ, "GPULEDGER_HOME": os.path.join(tmp, "home")}
    run = [gpuledger_executable(), "run", "-q", "--db", f"sqlite:///{tmp}/ledger.db", "--", sys.executable]
    subprocess.run([*run, "-c", "pass"], env=env, check=True)  # creates the ledger: not a run's cost
    fixed = []
    for _ in range(rounds):
        bare = whole_run([sys.executable, "-c", "pass"], dict(os.environ), False)[1]
        fixed.append(whole_run([*run, "-c", "pass"], env, False)[1] - bare)
    tee = min(_tee_cpu(path, f"{tmp}/tee.out") for _ in range(rounds))
    print(
        f"gpuledger's fixed cost (run -q -- python -c pass, less python -c pass), best of {rounds}: {min(fixed):.3f} s"
    )
    print(f"`tee COPY` of the file (its CPU from wait4), best of {rounds}: {tee:.3f} s")
    least = floor_s + min(fixed) + tee
    print(
        f"the four, the fixed cost and tee's copy: {least:.3f} s of the 0.5 s that 100 MB/s allows; what is left"
        f" ({0.5 - least:.3f} s) is all the redaction's and the index's logic, the epoch parse and the metric rows"
    )


def _tee_cpu(path: str, copy: str) -> float:
    with open(path, "rb") as source:
        return _wait(subprocess.Popen(["tee", copy], stdin=source, stdout=subprocess.DEVNULL))


def _other_codecs() -> list[tuple[str, Callable[[bytes], object]]]:
    out: list[tuple[str, Callable[[bytes], object]]] = []
    try:
        from backports import zstd  # type: ignore[import-not-found]

        out.append(("zstd level -5", lambda d: zstd.compress(d, -5)))
    except ImportError:
        pass
    try:
        import lz4.frame  # type: ignore[import-not-found]

        out.append(("lz4 frame, default", lz4.frame.compress))
    except ImportError:
        pass
    return out


if __name__ == "__main__":
    main()
