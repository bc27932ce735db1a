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

import json
import re
import subprocess
import sys
from pathlib import Path

from gpuledger.node.slurm_files import read_mapping

DEPLOY = Path(__file__).parent.parent / "deploy" / "slurm"
PROLOG = DEPLOY / "gpuledger-prolog.sh"
EPILOG = DEPLOY / "gpuledger-epilog.sh"
_GPU_ID = re.compile(r"[0-9]+(\.[0-9]+)?")


SLICE_A = "MIG-5f2d8e21-aaaa-5b5b-9c9c-000000000001"
SLICE_B = "MIG-5f2d8e21-aaaa-5b5b-9c9c-000000000002"


def write_mig_trace(path: Path) -> Path:
    """A replay trace of a node: GPU 0 whole, GPU 1 in MIG mode with slices of GPU instances 3 and 5."""
    gpus = [{"uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA A100-SXM4-80GB"},
            {"uuid": "GPU-aaaaaaaa-2222-3333-4444-555555555555", "name": "NVIDIA A100-SXM4-80GB",
             "mig": [{"uuid": SLICE_A, "profile": "3g.40gb", "gi": 3, "ci": 0},
                     {"uuid": SLICE_B, "profile": "3g.40gb", "gi": 5, "ci": 0}]}]  # fmt: skip
    path.write_text(json.dumps({"format": "gpuledger-gpu-trace", "gpus": gpus}) + "\n" + '{"t": 0, "gpu": 0}\n')
    return path


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
    base = {"GPULEDGER_GPUSTAT_DIR": str(tmp_path / "gpustat"), "GPULEDGER_SLURM_JOB_DIR": str(tmp_path / "jobs"),
            "GPULEDGER_BIN": str(tmp_path / "no-gpuledger-here")}  # fmt: skip
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


def fake_gpuledger(tmp_path: Path, body: str) -> Path:
    """A stand-in for `gpuledger` on GPULEDGER_BIN: records its arguments, then runs ``body``."""
    path = tmp_path / "bin" / "gpuledger"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" >"{tmp_path}/args"\n{body}\n')
    path.chmod(0o755)
    return path


# What `gpuledger agent mig-map` prints on a node whose GPU 0 holds MIG slices of GPU instances 1
# and 2 and whose GPU 3 is whole; anything else it names on stderr and exits 1.
MIG_MAP = """for u in "${@:4}"; do
  case $u in
    MIG-5f2d8e21-aaaa) echo "$u 0.1" ;;
    MIG-5f2d8e21-bbbb) echo "$u 0.2" ;;
    GPU-0b3a1c4e) echo "$u 3" ;;
    *) echo "gpuledger agent mig-map: $u: no such device on this node" >&2; bad=1 ;;
  esac
done
exit ${bad:-0}"""


def test_a_mig_slice_gets_dcgm_exporters_gpu_dot_instance_file(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    bin_ = fake_gpuledger(tmp_path, MIG_MAP)
    first = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="60", SLURM_JOB_UID="1001", GPULEDGER_BIN=str(bin_),
                CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa,2")  # fmt: skip
    second = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="61", SLURM_JOB_UID="1002", GPULEDGER_BIN=str(bin_),
                 CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-bbbb")  # fmt: skip
    assert first.returncode == second.returncode == 0 and first.stderr == second.stderr == ""
    assert (tmp_path / "args").read_text() == "agent\nmig-map\n--\nMIG-5f2d8e21-bbbb\n"  # UUIDs only
    # dcgm-exporter labels each slice's series with its own job, and the whole GPU's with its job
    assert upstream_hpc_labels(dcgm, "0", "1") == ["60"]
    assert upstream_hpc_labels(dcgm, "0", "2") == ["61"]
    assert upstream_hpc_labels(dcgm, "0") == []  # no job holds GPU 0 whole
    assert upstream_hpc_labels(dcgm, "2") == ["60"]
    # the epilog takes the job out of its slice's file
    done = run(EPILOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="60")
    assert done.returncode == 0 and upstream_gpu_files(dcgm) == {"0.2": ["61"]}


def test_a_gpu_uuid_gets_its_index_file(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    bin_ = fake_gpuledger(tmp_path, MIG_MAP)
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="62", GPULEDGER_BIN=str(bin_),
               CUDA_VISIBLE_DEVICES="GPU-0b3a1c4e")  # fmt: skip
    assert done.returncode == 0 and done.stderr == ""
    assert upstream_hpc_labels(dcgm, "3") == ["62"]


def test_what_mig_map_cannot_resolve_gets_no_file_and_the_prolog_says_why(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    bin_ = fake_gpuledger(tmp_path, MIG_MAP)
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="63", GPULEDGER_BIN=str(bin_),
               CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa,MIG-0000dead-cccc")  # fmt: skip
    assert done.returncode == 0
    assert "MIG-0000dead-cccc: no such device on this node" in done.stderr  # mig-map's own reason
    assert "MIG-0000dead-cccc not resolved to a GPU index" in done.stderr
    assert upstream_gpu_files(dcgm) == {"0.1": ["63"]}
    # the jobstats directory has both, by UUID, as before
    assert read_mapping(str(tmp_path / "gpustat")).jobs() == {"63": {"MIG-5f2d8e21-aaaa", "MIG-0000dead-cccc"}}


def test_only_the_uuids_asked_and_names_of_digits_are_taken_from_mig_map(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    bin_ = fake_gpuledger(tmp_path, 'echo "MIG-5f2d8e21-aaaa ../escape"; echo "MIG-other 4.1"; '
                                    'echo "MIG-5f2d8e21-bbbb 1.3 extra"; echo "GPU-0b3a1c4e 5"')  # fmt: skip
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="64", GPULEDGER_BIN=str(bin_),
               CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa,MIG-5f2d8e21-bbbb,GPU-0b3a1c4e")  # fmt: skip
    assert done.returncode == 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and "escape" in p.name) == []
    assert upstream_gpu_files(dcgm) == {"5": ["64"]}
    assert "MIG-5f2d8e21-aaaa not resolved" in done.stderr and "MIG-5f2d8e21-bbbb not resolved" in done.stderr


def test_a_hung_mig_map_is_cut_off_and_the_job_still_starts(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    bin_ = fake_gpuledger(tmp_path, "exec sleep 300")
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="65", GPULEDGER_BIN=str(bin_),
               GPULEDGER_MIG_MAP_TIMEOUT="1", CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa,1")  # fmt: skip
    assert done.returncode == 0
    assert "mig-map timed out after 1 s" in done.stderr and "MIG-5f2d8e21-aaaa not resolved" in done.stderr
    assert upstream_gpu_files(dcgm) == {"1": ["65"]}  # the index still gets its file
    assert read_mapping(str(tmp_path / "gpustat")).jobs() == {"65": {"MIG-5f2d8e21-aaaa", "1"}}


def test_without_a_gpuledger_executable_uuids_get_no_dcgm_file_and_the_prolog_says_why(tmp_path: Path) -> None:
    dcgm = tmp_path / "dcgm-job-map"
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="30", SLURM_JOB_UID="1001",
               CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa,GPU-0b3a1c4e,2")  # fmt: skip
    assert done.returncode == 0
    assert f"no executable GPULEDGER_BIN ({tmp_path}/no-gpuledger-here)" in done.stderr
    assert "MIG-5f2d8e21-aaaa GPU-0b3a1c4e" in done.stderr
    assert upstream_gpu_files(dcgm) == {"2": ["30"]}
    assert sorted(p.name for p in (tmp_path / "gpustat").iterdir() if not p.name.startswith(".")) == [
        "2", "GPU-0b3a1c4e", "MIG-5f2d8e21-aaaa"
    ]  # fmt: skip


def test_the_real_resolver_behind_the_prolog(tmp_path: Path) -> None:
    """`gpuledger agent mig-map` itself on GPULEDGER_BIN, reading a scripted MIG node (replay trace)."""
    trace = write_mig_trace(tmp_path / "node.jsonl")
    bin_ = tmp_path / "gpuledger"
    bin_.write_text(f'#!/bin/bash\nexec {sys.executable} -m gpuledger "$1" "$2" --replay-gpus {trace} "${{@:3}}"\n')
    bin_.chmod(0o755)
    dcgm = tmp_path / "dcgm-job-map"
    done = run(PROLOG, tmp_path, dcgm=dcgm, SLURM_JOB_ID="70", SLURM_JOB_UID="1001", GPULEDGER_BIN=str(bin_),
               CUDA_VISIBLE_DEVICES=f"{SLICE_B},0")  # fmt: skip
    assert done.returncode == 0 and done.stderr == ""
    assert upstream_hpc_labels(dcgm, "1", "5") == ["70"]  # GPU 1's slice of GPU instance 5
    assert upstream_hpc_labels(dcgm, "1", "3") == [] and upstream_hpc_labels(dcgm, "0") == ["70"]


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
