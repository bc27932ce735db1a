"""What Slurm's commands print, read (pure): ``scontrol show job -d``, ``show node -d``, ``listpids``.

The formats, and where they are stated (Slurm's own documentation and source, SchedMD/slurm):

* ``scontrol show job -d <id>`` and ``show node -d <name>`` print one record of ``Key=Value``
  words over several lines (``-o`` would put it on one). Values have no spaces, except the
  free-text fields, each printed on a line of its own (``Comment=``, ``AdminComment=``,
  ``SystemComment=``, ``Extra=``, ``Command=``, ``WorkDir=``, ``StdErr=``, ``StdIn=``,
  ``StdOut=``, ``Reason=`` of a node): the rest of their line is their value
  (src/scontrol/info_job.c, src/api/node_info.c). Unknown keys are ignored, so a newer Slurm's
  extra fields change nothing.
* The job's user is ``UserId=<name>(<uid>)``; ``Account=``, ``Partition=``, ``JobState=`` follow.
* ``-d`` adds, per group of nodes given the same resources, a line
  ``Nodes=<hostlist> CPU_IDs=<list> Mem=<MB> GRES=<gres>`` (``GRES_IDX=`` before Slurm 18.08),
  where ``<gres>`` is a comma-separated list of ``name[:type]:count(IDX:<index list>)`` — e.g.
  ``gpu:a100:2(IDX:0-1)``, ``gpu:h100:1(IDX:0),gpu:l40s:2(IDX:1-2)``, the older ``gpu(IDX:0-7)``,
  or ``gpu(CNT:2)`` when the indices are unknown (src/slurmctld/gres_ctld.c,
  ``gres_ctld_job_build_details``). The indices are the node's GRES indices: the order of the
  node's GPUs in gres.conf (``AutoDetect=nvml`` lists them in NVML's order).
* The node's ``GresUsed=`` has the same item shape, ``gpu:a100:2(IDX:0-1),gpu:l40s:0(IDX:N/A)``
  (src/common/gres.c): every index in use on the node, whoever holds it.
* A shared GRES (``shard``, ``mps``) is printed per device since Slurm 23.11.2: the job's detail
  ``shard:2(1/4,1/4,0/4,0/4)`` gives, for each GPU of the node in index order, the shares this job
  holds / the shares that GPU has (src/stepmgr/gres_stepmgr.c, ``_build_shared_gres_details``,
  called from ``gres_stepmgr_job_build_details``: ``"%"PRIu64"/%"PRIu64","`` per bit of the
  job's ``gres_bit_alloc``); the node's ``GresUsed=gpu:1(IDX:0),shard:8(-/5,5/5,3/5,0/5)`` gives
  shares in use / shares per GPU, ``-`` where no count is given (there, a GPU allocated whole).
  A GPU holding at least one share is a GPU in use. The older ``shard:2(IDX:1)`` still parses.
  A malformed item loses only itself (``GresValue.bad``): the GPUs the other items name stay.
* Index lists are Slurm bitmaps printed with ``bit_fmt``: ``0-1,3``. Host lists are Slurm
  hostlist expressions: ``gpu[01-04,07]``, ``rack[1-2]-n[1-3]``, comma-separated.
* ``scontrol listpids [job[.step]]`` prints ``PID JOBID STEPID LOCALID GLOBALID`` and one row per
  process of every step on this node (``%-8d %-8d %-8s %-7s %-8s``; ``-`` for a process that is
  not a task, such as the step's ``slurmstepd`` children); the step is ``batch``, ``extern``,
  ``interactive``, a number, or ``<n>+<het component>``. With no step on the node it prints
  ``No job steps exist on this node.`` on stderr and exits 1 (src/scontrol/info_job.c,
  ``scontrol_list_pids``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import product

GPU_GRES = ("gpu", "shard", "mps")  # a shard or an MPS share of a GPU is a claim on that GPU too
FREE_TEXT_KEYS = frozenset(
    {"Comment", "AdminComment", "SystemComment", "Extra", "Command", "WorkDir", "StdErr", "StdIn", "StdOut", "Reason"}
)
_RECORD_START = ("JobId=", "NodeName=")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_/:.\-]*$")
_GRES_ITEM = re.compile(r"^(?P<head>[^()]+?)(?:\((?P<detail>[^()]*)\))?$")
_USER = re.compile(r"^(?P<name>[^()]*)\((?P<uid>\d+)\)$")
_LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
MAX_HOSTS = 100_000  # a host list longer than this is not expanded (no cluster job spans more)


class SlurmFormatError(ValueError):
    """Text that is not the format documented above."""


# -- records -----------------------------------------------------------------------------------------
def parse_records(text: str) -> list[dict[str, str]]:
    """The records of ``scontrol show job|node`` output, each ``Key -> Value``.

    Repeated keys (the ``Nodes=`` lines of ``-d``) are kept apart by ``detail_lines``; here the last
    one wins."""
    records: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(_RECORD_START):
            current = {}
            records.append(current)
        if current is None:
            continue  # a warning or banner before the first record
        current.update(_line_fields(stripped))
    return records


def _line_fields(line: str) -> dict[str, str]:
    key, eq, rest = line.partition("=")
    if eq and key in FREE_TEXT_KEYS:
        return {key: rest.rstrip()}
    out: dict[str, str] = {}
    for word in line.split():
        key, eq, value = word.partition("=")
        if eq and _KEY.match(key):
            out[key] = value
    return out


def detail_lines(text: str) -> list[dict[str, str]]:
    """The ``Nodes=... CPU_IDs=... Mem=... GRES=...`` lines of ``show job -d``, in order."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Nodes=") and ("GRES" in stripped or "CPU_IDs=" in stripped):
            out.append(_line_fields(stripped))
    return out


# -- index lists and GRES ------------------------------------------------------------------------------
def index_list(text: str) -> set[int]:
    """``"0-1,3"`` → {0, 1, 3}; ``"N/A"`` or ``""`` → set()."""
    text = text.strip()
    if text in ("", "N/A", "(null)"):
        return set()
    out: set[int] = set()
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise SlurmFormatError(f"{text!r} is not an index list such as 0-1,3")
        first, last = int(low), int(high) if dash else int(low)
        if last < first:
            raise SlurmFormatError(f"{text!r} has a range that runs backwards")
        out.update(range(first, last + 1))
    return out


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside parentheses and brackets (``gpu:1(IDX:0,2),mps:0`` → two items)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [part.strip() for part in out if part.strip()]


@dataclass(frozen=True)
class GresItem:
    name: str  # gpu, shard, mps, ...
    type: str | None
    count: int | None
    indices: frozenset[int] | None  # None: the item does not say which (CNT:, or no detail)


@dataclass(frozen=True)
class GresValue:
    """A ``GRES=`` / ``GresUsed=`` value: the items read, and the ones that could not be (each
    with why), so one malformed item never takes the others' GPUs with it."""

    items: tuple[GresItem, ...]
    bad: tuple[str, ...] = ()

    def gpu_indices(self) -> frozenset[int] | None:
        """The GPU indices the items name; None when a GPU item gives no index, or when no GPU
        item could be read but one could not (then which GPUs is unknown, not "none")."""
        found: set[int] = set()
        gpu_items = [item for item in self.items if item.name in GPU_GRES]
        if not gpu_items and any(_gpu_piece(why) for why in self.bad):
            return None
        for item in gpu_items:
            if item.indices is None:
                if item.count == 0:
                    continue
                return None
            found |= item.indices
        return frozenset(found)


def parse_gres(text: str) -> GresValue:
    """The items of a ``GRES=`` / ``GresUsed=`` value. ``(null)`` and ``""`` are none."""
    text = text.strip()
    if text in ("", "(null)", "N/A"):
        return GresValue(())
    items, bad = [], []
    for part in split_top(text):
        try:
            items.append(_gres_item(part))
        except SlurmFormatError as exc:
            bad.append(str(exc))
    return GresValue(tuple(items), tuple(bad))


def gres_items(text: str) -> list[GresItem]:
    """The items of a value; a malformed one is an error (``parse_gres`` keeps the others)."""
    value = parse_gres(text)
    if value.bad:
        raise SlurmFormatError("; ".join(value.bad))
    return list(value.items)


def _gres_item(part: str) -> GresItem:
    m = _GRES_ITEM.match(part)
    if m is None:
        raise SlurmFormatError(f"{part!r} is not a GRES item such as gpu:a100:2(IDX:0-1)")
    head = m.group("head").split(":")
    name, rest = head[0], head[1:]
    count = int(rest.pop()) if rest and rest[-1].isdigit() else None
    gtype = ":".join(rest) or None
    indices: frozenset[int] | None = None
    detail = m.group("detail")
    if detail is not None:
        kind, colon, value = detail.partition(":")
        if not colon and "/" in detail:
            indices = _shared_indices(detail, part)
        elif kind == "IDX":
            indices = frozenset(_index_list(value, part))
        elif kind == "CNT" and value.isdigit() and count is None:
            count = int(value)
    return GresItem(name, gtype, count, indices)


def _index_list(value: str, part: str) -> set[int]:
    try:
        return index_list(value)
    except SlurmFormatError as exc:
        raise SlurmFormatError(f"{part!r}: {exc}") from None


def _shared_indices(detail: str, part: str) -> frozenset[int]:
    """``1/4,0/4,-/5``: per GPU in index order, shares held (or ``-``) / shares it has."""
    out = set()
    for i, pair in enumerate(detail.split(",")):
        held, slash, total = pair.strip().partition("/")
        if not slash or not total.isdigit() or not (held.isdigit() or held == "-"):
            raise SlurmFormatError(f"{part!r} is not a per-GPU share list such as shard:2(1/4,1/4,0/4)")
        if held.isdigit() and int(held) > 0:
            out.add(i)
    return frozenset(out)


def _gpu_piece(why: str) -> bool:
    """Whether a bad item's message (it starts with the item, quoted) is of a GPU GRES."""
    name = why.lstrip("'\"").split(":", 1)[0].split("(", 1)[0]
    return name in GPU_GRES


def gpu_indices(text: str) -> frozenset[int] | None:
    """The GPU indices a ``GRES=`` / ``GresUsed=`` value names; None when a GPU item gives no index."""
    return parse_gres(text).gpu_indices()


# -- host lists ---------------------------------------------------------------------------------------
def expand_hostlist(expr: str) -> Iterator[str]:
    """Every name of a Slurm hostlist expression (``gpu[01-03,07],login1``), in order."""
    count = 0
    for part in split_top(expr):
        for name in _expand_one(part):
            count += 1
            if count > MAX_HOSTS:
                raise SlurmFormatError(f"host list {expr[:80]!r} names more than {MAX_HOSTS} hosts")
            yield name


def _expand_one(part: str) -> Iterator[str]:
    pieces: list[list[str]] = []
    pos = 0
    for m in re.finditer(r"\[([^\]]*)\]", part):
        pieces.append([part[pos : m.start()]])
        pieces.append(list(_bracket(m.group(1), part)))
        pos = m.end()
    pieces.append([part[pos:]])
    if any("[" in p or "]" in p for group in pieces[::2] for p in group):
        raise SlurmFormatError(f"{part!r} is not a host list such as gpu[01-04]")
    for combo in product(*pieces):
        yield "".join(combo)


def _bracket(inner: str, whole: str) -> Iterator[str]:
    for rng in inner.split(","):
        low, dash, high = rng.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise SlurmFormatError(f"{whole!r} has a bad range {rng!r}")
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        first, last = int(low), int(high) if dash else int(low)
        if last - first > MAX_HOSTS:
            raise SlurmFormatError(f"host list {whole[:80]!r} names more than {MAX_HOSTS} hosts")
        for n in range(first, last + 1):
            yield str(n).zfill(width)


def hostlist_has(expr: str, node: str) -> bool:
    """Whether ``node`` is in the host list (its short name too: Slurm NodeNames are usually short)."""
    short = node.split(".", 1)[0]
    return any(name == node or name.split(".", 1)[0] == short for name in expand_hostlist(expr))


# -- jobs ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobDetails:
    """What ``scontrol show job -d`` says of one job, as seen from one node."""

    job_id: str
    state: str | None = None
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    comment: str | None = None
    # GRES indices of GPUs on *this* node; None: the record does not say (no -d line for the node)
    gpus_here: frozenset[int] | None = None
    nodes: str | None = None  # NodeList=
    gres_problems: tuple[str, ...] = ()  # GRES items on this node that could not be read


def parse_job(text: str, node: str) -> JobDetails:
    """The job of ``scontrol show job -d <id>`` output, its GPUs on ``node``."""
    records = parse_records(text)
    if not records or "JobId" not in records[0]:
        raise SlurmFormatError("no JobId= record in the output of scontrol show job")
    rec = records[0]
    user, uid = _user(rec.get("UserId"))
    gpus: frozenset[int] | None = None
    bad: list[str] = []
    for line in detail_lines(_first_record_text(text)):
        hosts = line.get("Nodes")
        if not hosts or not hostlist_has(hosts, node):
            continue
        value = parse_gres(line.get("GRES", line.get("GRES_IDX", "")))
        bad += value.bad
        found = value.gpu_indices()
        gpus = found if gpus is None or found is None else gpus | found
        if found is None:
            break  # a GPU item without indices: which ones is unknown
    return JobDetails(
        job_id=rec["JobId"],
        state=_null(rec.get("JobState")),
        user=user,
        uid=uid,
        account=_null(rec.get("Account")),
        partition=_null(rec.get("Partition")),
        comment=_null(rec.get("Comment")),
        gpus_here=gpus,
        nodes=_null(rec.get("NodeList")),
        gres_problems=tuple(bad),
    )


def _first_record_text(text: str) -> str:
    """The first record's lines only (a het job prints one record per component)."""
    out: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("JobId=") and out:
            break
        out.append(line)
    return "\n".join(out)


def _user(value: str | None) -> tuple[str | None, int | None]:
    if not value:
        return None, None
    m = _USER.match(value)
    if m is None:
        return (value if value.isidentifier() else None), None
    return (m.group("name") or None), int(m.group("uid"))


def _null(value: str | None) -> str | None:
    value = (value or "").strip()
    return None if value in ("", "(null)", "N/A") else value


# -- nodes --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeDetails:
    name: str
    gres: str | None
    gpus_in_use: frozenset[int] | None  # None: GresUsed names no index (shown without -d)
    state: str | None = None
    gres_problems: tuple[str, ...] = ()  # GresUsed items that could not be read


def parse_node(text: str) -> NodeDetails:
    records = parse_records(text)
    if not records or "NodeName" not in records[0]:
        raise SlurmFormatError("no NodeName= record in the output of scontrol show node")
    rec = records[0]
    used = parse_gres(rec.get("GresUsed", ""))
    return NodeDetails(
        name=rec["NodeName"],
        gres=_null(rec.get("Gres")),
        gpus_in_use=used.gpu_indices(),
        state=_null(rec.get("State")),
        gres_problems=used.bad,
    )


# -- listpids -----------------------------------------------------------------------------------------
@dataclass
class StepPids:
    """``scontrol listpids``: job id -> step -> pids."""

    steps: dict[str, dict[str, set[int]]] = field(default_factory=dict)

    def job_pids(self, job_id: str) -> frozenset[int]:
        return frozenset(p for pids in self.steps.get(job_id, {}).values() for p in pids)


def parse_listpids(text: str) -> StepPids:
    """The rows of ``scontrol listpids`` (header and unknown lines skipped; extra columns ignored)."""
    out = StepPids()
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or not words[0].isdigit() or not words[1].isdigit():
            continue  # the header, a blank, or a message
        pid, job, step = int(words[0]), words[1], words[2]
        if pid <= 0 or not re.fullmatch(r"[A-Za-z0-9+_\-]+", step):
            continue
        out.steps.setdefault(job, {}).setdefault(step, set()).add(pid)
    return out


# -- the job's comment --------------------------------------------------------------------------------
def comment_labels(comment: str | None) -> dict[str, str]:
    """``key=value`` words of a job's comment (separated by commas, semicolons or spaces) as labels:
    ``sbatch --comment "team=vision,project=defect-detection"``. Other words are ignored."""
    out: dict[str, str] = {}
    for word in re.split(r"[,;\s]+", comment or ""):
        key, eq, value = word.partition("=")
        if eq and value and _LABEL_KEY.match(key):
            out[key] = value
    return out
