"""The prolog's files as NVIDIA's dcgm-exporter reads an ``--hpc-job-mapping-dir``.

``upstream_hpc_labels`` is written from dcgm-exporter's documented behaviour, not from our scripts:
its README ("How to include HPC jobs in metric labels": a file per GPU id, a job id a line) and
its HPC mapper (``internal/pkg/transformation/hpc.go`` and ``hpc_test.go`` in NVIDIA/dcgm-exporter):
a regular file counts when its whole name is a GPU id, ``<gpu>`` or ``<gpu>.<gpu instance>`` in
decimal digits (``1e5``, ``+3``, ``.5``, ``1.2.3``, ``foo`` are skipped); each line is taken
verbatim as one job (a scanner's lines: the newline, and a carriage return before it, dropped),
repeated jobs once, in order; a metric of GPU ``g`` (instance ``i``) gets one copy per job, labelled
``hpc_job="<job>"``, from the file ``g.i`` when there is one, else ``g``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from gpuledger.node.slurm_files import read_mapping

DEPLOY = Path(__file__).parent.parent / "deploy" / "slurm"
PROLOG = DEPLOY / "gpuledger-prolog.sh"
EPILOG = DEPLOY / "gpuledger-epilog.sh"
_GPU_ID = re.compile(r"[0-9]+(\.[0-9]+)?")


def upstream_gpu_files(directory: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for entry in directory.iterdir():
        if entry.is_dir() or not _GPU_ID.fullmatch(entry.name):
            continue
        jobs: list[str] = []
        for line in entry.read_bytes().decode().split("\n"):
            line = line.removesuffix("\r")
            if line and line not in jobs:  # the final newline leaves no line
                jobs.append(line)
        out[entry.name] = jobs
    return out


def upstream_hpc_labels(directory: Path, gpu: str, instance: str | None = None) -> list[str]:
    """The ``hpc_job`` values dcgm-exporter gives a metric of ``gpu`` (and GPU instance ``instance``)."""
    files = upstream_gpu_files(directory)
    if instance is not None and f"{gpu}.{instance}" in files:
        return files[f"{gpu}.{instance}"]
    return files.get(gpu, [])


def run(script: Path, tmp_path: Path, *, dcgm: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"GPULEDGER_GPUSTAT_DIR": str(tmp_path / "gpustat"), "GPULEDGER_SLURM_JOB_DIR": str(tmp_path / "jobs")}
    if dcgm is not None:
        base["GPULEDGER_DCGM_JOB_MAP_DIR"] = str(dcgm)
    return subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True, text=True, check=False)


def test_the_reader_follows_upstreams_file_name_rules(tmp_path: Path) -> None:
    for name in ("0", "3.10", "1e5", "+3", ".5", "1.2.3", "foo", "NaN"):
        (tmp_path / name).write_text("job\n")
    (tmp_path / "7").mkdir()
    assert sorted(upstream_gpu_files(tmp_path)) == ["0", "3.10"]


def test_dcgm_exporter_labels_each_job_of_the_dcgm_directory_by_its_id_alone(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    first = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="20", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0,1")
    second = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="21", SLURM_JOB_UID="1002", SLURM_JOB_GPUS="1")
    assert first.returncode == second.returncode == 0 and first.stderr == second.stderr == ""
    assert upstream_hpc_labels(dcgm, "0") == ["20"]
    assert upstream_hpc_labels(dcgm, "1") == ["20", "21"]  # two jobs sharing a GPU: two series
    assert upstream_hpc_labels(dcgm, "2") == []
    # the jobstats directory keeps its own format, which our agent reads as before
    mapping = read_mapping(str(tmp_path / "gpustat"))
    assert mapping.jobs() == {"20": {"0", "1"}, "21": {"1"}} and not mapping.problems
    assert {h.uid for hs in mapping.holders.values() for h in hs} == {1001, 1002}
    # and our own reader takes dcgm-exporter's directory too (a job id a line, no uid)
    assert read_mapping(str(dcgm)).jobs() == {"20": {"0", "1"}, "21": {"1"}}


def test_the_jobstats_directory_is_not_for_dcgm_exporter(tmp_path: Path) -> None:
    # Why the two directories are kept apart: pointed at the jobstats files, dcgm-exporter would
    # label the series with the whole line, and skip a MIG UUID's file.
    run(PROLOG, tmp_path, dcgm=None, SLURM_JOB_ID="12345", SLURM_JOB_UID="1000",
        CUDA_VISIBLE_DEVICES="0,MIG-5f2d8e21-aaaa")  # fmt: skip
    assert upstream_hpc_labels(tmp_path / "gpustat", "0") == ["12345 1000"]
    assert sorted(upstream_gpu_files(tmp_path / "gpustat")) == ["0"]
    assert not (tmp_path / "dcgm-job-map").exists()  # nothing for dcgm-exporter unless asked


def test_a_mig_slice_or_gpu_uuid_gets_no_dcgm_file_and_the_prolog_says_why(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="30", SLURM_JOB_UID="1001",
               CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa,GPU-0b3a1c4e,2")  # fmt: skip
    assert done.returncode == 0
    assert "MIG-5f2d8e21-aaaa is no GPU index" in done.stderr and "GPU-0b3a1c4e is no GPU index" in done.stderr
    assert upstream_gpu_files(dcgm) == {"2": ["30"]}
    assert sorted(p.name for p in (tmp_path / "gpustat").iterdir() if not p.name.startswith(".")) == [
        "2", "GPU-0b3a1c4e", "MIG-5f2d8e21-aaaa"
    ]  # fmt: skip


def test_the_epilog_clears_the_job_from_both_directories(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="40", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0,1")
    run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="41", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="1")
    done = run(EPILOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="40")
    assert done.returncode == 0 and done.stderr == ""
    assert upstream_gpu_files(dcgm) == {"1": ["41"]}
    assert read_mapping(str(tmp_path / "gpustat")).jobs() == {"41": {"1"}}
    assert not [p for p in dcgm.iterdir() if p.name.startswith(".gpuledger.")]  # no temporary file left


def test_one_directory_for_both_formats_is_refused(tmp_path: Path) -> None:
    done = run(PROLOG, tmp_path, dcgm=tmp_path / "gpustat", SLURM_JOB_ID="50", SLURM_JOB_UID="1001",
               CUDA_VISIBLE_DEVICES="0")  # fmt: skip
    assert done.returncode == 0 and "is the jobstats directory" in done.stderr
    assert (tmp_path / "gpustat" / "0").read_text() == "50 1001\n"  # the jobstats line only, no bare "50"
