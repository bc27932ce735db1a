"""The files a Slurm prolog leaves on the node: which job holds which GPU, and who the job is (pure reads).

**GPU → job mapping files** (read from ``GPULEDGER_GPUSTAT_DIR``, default ``/run/gpustat``): one
file per GPU, named after the GPU, holding the job(s) on it. Two published conventions share that
shape, and both are read:

* Princeton's jobstats (docs/setup/gpu_node_scripts.md, "GPU Job Ownership Helper", in the
  PrincetonUniversity/jobstats repository): ``/run/gpustat/<GPU index>``, or
  ``/run/gpustat/<GPU-UUID or MIG-UUID>``, containing ``<jobid> <uid>`` (space-separated), written by
  a ``prolog.d`` script and removed by an ``epilog.d`` script. The ``deploy/slurm`` prolog writes
  this format into this directory;
* NVIDIA's dcgm-exporter's ``--hpc-job-mapping-dir`` (its README, "How to include HPC jobs in metric
  labels"; ``internal/pkg/transformation/hpc.go``): files named ``<gpu index>`` or ``<gpu>.<gpu
  instance>``, each line taken whole as a job id. The prolog writes this format only into a
  directory of its own (``GPULEDGER_DCGM_JOB_MAP_DIR``), never into jobstats': dcgm-exporter would
  label ``hpc_job="<jobid> <uid>"`` and skip a ``MIG-`` file name.

So a file is named ``<index>``, ``GPU-<uuid>``, ``MIG-<uuid>`` or ``<gpu>.<instance>``; each
non-empty line is ``<jobid> [<uid>]``. Several lines are several jobs sharing the GPU. Dot-files (a
writer's lock or temporary file) are skipped.

**Job facts files** (``GPULEDGER_SLURM_JOB_DIR``, default ``/run/gpuledger/slurm``): gpuledger's
own, written by the same prolog from the environment Slurm gives it, so the agent needs no
``scontrol show job`` for the job: ``<jobid>.job`` with one ``key=value`` per line — ``job``,
``uid``, ``user``, ``account``, ``partition``, ``gpus`` (the prolog's ``CUDA_VISIBLE_DEVICES``,
else ``SLURM_JOB_GPUS``) and ``comment`` (the job's ``--comment``, newlines made spaces).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_FILE_BYTES = 65536  # a mapping or facts file is a line or two; more is not ours
_JOB_ID = re.compile(r"^\d+$")
_INDEX = re.compile(r"^\d+$")
_UUID_NAME = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+$")
_MIG_PAIR = re.compile(r"^\d+\.\d+$")  # dcgm-exporter's <gpu>.<gpu instance>
FACT_KEYS = ("job", "uid", "user", "account", "partition", "gpus", "comment")


@dataclass(frozen=True)
class GpuHolder:
    job_id: str
    uid: int | None = None


@dataclass(frozen=True)
class GpuMapping:
    """The mapping directory as read: GPU name -> the jobs on it."""

    present: bool  # the directory exists
    holders: dict[str, tuple[GpuHolder, ...]] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def jobs(self) -> dict[str, set[str]]:
        """job id -> the GPU names it holds."""
        out: dict[str, set[str]] = {}
        for gpu, holders in self.holders.items():
            for holder in holders:
                out.setdefault(holder.job_id, set()).add(gpu)
        return out


@dataclass(frozen=True)
class JobFacts:
    job_id: str
    uid: int | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    comment: str | None = None
    gpus: tuple[str, ...] | None = None  # None: the file does not say; (): the job has none here


def is_gpu_name(name: str) -> bool:
    return bool(_INDEX.match(name) or _UUID_NAME.match(name) or _MIG_PAIR.match(name))


def read_mapping(directory: str) -> GpuMapping:
    """Every mapping file of ``directory``; an unreadable or malformed one is a problem, not an error."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return GpuMapping(present=False)
    except OSError as exc:
        return GpuMapping(present=True, problems=(f"{directory} unreadable: {exc.strerror or exc}",))
    holders: dict[str, tuple[GpuHolder, ...]] = {}
    problems: list[str] = []
    for name in names:
        if name.startswith("."):
            continue
        path = os.path.join(directory, name)
        if not is_gpu_name(name):
            problems.append(f"{path}: not named after a GPU (an index, GPU-/MIG-UUID or <gpu>.<instance>)")
            continue
        text, why = _read(path)
        if text is None:
            if why:
                problems.append(why)
            continue
        found: list[GpuHolder] = []
        for line in text.splitlines():
            words = line.split()
            if not words:
                continue
            if not _JOB_ID.match(words[0]) or (len(words) > 1 and not words[1].isdigit()):
                problems.append(f"{path}: {line.strip()[:60]!r} is not '<jobid> [<uid>]'")
                continue
            holder = GpuHolder(words[0], int(words[1]) if len(words) > 1 else None)
            if holder not in found:
                found.append(holder)
        if found:
            holders[name] = tuple(found)
    return GpuMapping(present=True, holders=holders, problems=tuple(problems))


def read_job_facts(directory: str) -> tuple[dict[str, JobFacts], list[str]]:
    """``<jobid>.job`` files of ``directory``: job id -> its facts, and the problems met."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}, []
    except OSError as exc:
        return {}, [f"{directory} unreadable: {exc.strerror or exc}"]
    out: dict[str, JobFacts] = {}
    problems: list[str] = []
    for name in names:
        stem, dot, ext = name.partition(".")
        if not dot or ext != "job" or not _JOB_ID.match(stem):
            continue
        path = os.path.join(directory, name)
        text, why = _read(path)
        if text is None:
            if why:
                problems.append(why)
            continue
        values = _facts(text)
        if values.get("job", stem) != stem:
            problems.append(f"{path}: names job {values['job']!r}, not {stem}")
            continue
        uid = values.get("uid")
        gpus = values.get("gpus")
        out[stem] = JobFacts(
            job_id=stem,
            uid=int(uid) if uid and uid.isdigit() else None,
            user=values.get("user") or None,
            account=values.get("account") or None,
            partition=values.get("partition") or None,
            comment=values.get("comment") or None,
            gpus=None if gpus is None else tuple(g for g in (p.strip() for p in gpus.split(",")) if is_gpu_name(g)),
        )
    return out, problems


def _facts(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() in FACT_KEYS:
            values[key.strip()] = value.strip()
    return values


def _read(path: str) -> tuple[str | None, str | None]:
    """(text, None), or (None, why) — (None, None) when the file went away meanwhile (an epilog)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:
        return None, f"{path}: a directory, not a mapping file"
    except OSError as exc:
        return None, f"{path} unreadable: {exc.strerror or exc}"
    if len(data) > MAX_FILE_BYTES:
        return None, f"{path}: larger than {MAX_FILE_BYTES} bytes, not read"
    return data.decode("utf-8", errors="replace"), None


def gpu_uuid(name: str, by_index: Mapping[int, str]) -> str | None:
    """The NVML UUID a GPU name stands for: an index through ``by_index``, a UUID as itself.
    ``<gpu>.<instance>`` (a MIG slice by GPU-instance id) cannot be resolved without DCGM: None."""
    if _UUID_NAME.match(name):
        return name
    if _INDEX.match(name):
        return by_index.get(int(name))
    return None
