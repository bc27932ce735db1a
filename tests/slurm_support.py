"""A fake ``scontrol`` on PATH for the Slurm adapter's tests (written from Slurm's documented output).

``FakeSlurm(tmp_path)`` makes a directory with an executable ``scontrol`` (a small Python script,
not importing gpuledger) and answers from files in a scenario directory, as the real one would:

* ``scontrol listpids`` prints ``listpids.out``; with no such file it says ``No job steps exist on
  this node.`` on stderr and exits 1, as Slurm does on a node without steps;
* ``scontrol show job -d <id>`` prints ``job-<id>.out``; an unknown id is
  ``slurm_load_jobs error: Invalid job id specified`` (exit 1);
* ``scontrol show node -d <name>`` prints ``node-<name>.out``; an unknown node is
  ``Node <name> not found`` (exit 1);
* ``scontrol show aliases`` prints ``aliases.out`` (empty when absent).

Every call is appended to ``calls.log`` (its arguments) and its pid to ``pids.log``. A file
``<verb>.sleep`` (``listpids``, ``job``, ``node``, ``aliases``) or ``all.sleep`` holding seconds
makes the call hang that long first; ``<verb>.fail`` or ``all.fail`` holding a message makes it
print that on stderr and exit 1 (a controller that cannot be reached).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

DATA = Path(__file__).parent / "data" / "slurm"

SCRIPT = r"""#!{python}
import os, sys, time
from pathlib import Path

here = Path({scenario!r})
args = sys.argv[1:]
with open(here / "calls.log", "a") as log:
    log.write(" ".join(args) + "\n")
with open(here / "pids.log", "a") as log:
    log.write(f"{{os.getpid()}}\n")
if args[:1] == ["listpids"]:
    verb, answer = "listpids", "listpids.out"
elif args[:3] == ["show", "job", "-d"] and len(args) == 4:
    verb, answer = "job", f"job-{{args[3]}}.out"
elif args[:3] == ["show", "node", "-d"] and len(args) == 4:
    verb, answer = "node", f"node-{{args[3]}}.out"
elif args[:2] == ["show", "aliases"]:
    verb, answer = "aliases", "aliases.out"
else:
    print(f"invalid keyword: {{' '.join(args)}}", file=sys.stderr)
    sys.exit(1)
for name in (f"{{verb}}.sleep", "all.sleep"):
    if (here / name).exists():
        time.sleep(float((here / name).read_text()))
for name in (f"{{verb}}.fail", "all.fail"):
    if (here / name).exists():
        print((here / name).read_text().strip(), file=sys.stderr)
        sys.exit(1)
path = here / answer
if path.exists():
    sys.stdout.write(path.read_text())
    sys.exit(0)
if verb == "listpids":
    print("No job steps exist on this node.", file=sys.stderr)
elif verb == "job":
    print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
elif verb == "node":
    print(f"Node {{args[3]}} not found", file=sys.stderr)
else:
    sys.exit(0)
sys.exit(1)
"""


class FakeSlurm:
    def __init__(self, tmp_path: Path) -> None:
        self.bin = tmp_path / "slurm-bin"
        self.scenario = tmp_path / "slurm-answers"
        self.bin.mkdir()
        self.scenario.mkdir()
        script = self.bin / "scontrol"
        script.write_text(SCRIPT.format(python=sys.executable, scenario=str(self.scenario)))
        script.chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        """An environment whose PATH finds this scontrol first (and the system's tools after it)."""
        return {"PATH": f"{self.bin}{os.pathsep}/usr/bin:/bin", "HOME": str(self.scenario), **extra}

    def answer(self, name: str, text: str | None = None, *, data: str | None = None) -> None:
        """Make ``name`` (``listpids.out``, ``job-42.out`` ...) print ``text``, or a file of tests/data/slurm."""
        if data is not None:
            shutil.copyfile(DATA / data, self.scenario / name)
        else:
            (self.scenario / name).write_text(text or "")

    def forget(self, name: str) -> None:
        (self.scenario / name).unlink(missing_ok=True)

    def calls(self) -> list[str]:
        log = self.scenario / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def pids(self) -> list[int]:
        log = self.scenario / "pids.log"
        return [int(p) for p in log.read_text().split()] if log.exists() else []


def listpids(rows: list[tuple[int, str, str]]) -> str:
    """``scontrol listpids`` output for (pid, job, step) rows, in Slurm's column format."""
    out = [f"{'PID':<8} {'JOBID':<8} {'STEPID':<8} {'LOCALID':<7} {'GLOBALID':<8}"]
    for i, (pid, job, step) in enumerate(rows):
        out.append(f"{pid:<8} {job:<8} {step:<8} {i:<7} {i:<8} ")
    return "\n".join(out) + "\n"
