"""deploy/slurm's prolog and epilog, run for real by bash against a temporary directory.

Slurm runs them as root with the job's variables in their environment (SLURM_JOB_ID, SLURM_JOB_UID,
CUDA_VISIBLE_DEVICES / SLURM_JOB_GPUS, ...); here the test sets those variables.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ci_support import missing

DEPLOY = Path(__file__).parent.parent / "deploy" / "slurm"
PROLOG = DEPLOY / "gpuledger-prolog.sh"
EPILOG = DEPLOY / "gpuledger-epilog.sh"


def run(script: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"GPULEDGER_GPUSTAT_DIR": str(tmp_path / "gpustat"), "GPULEDGER_SLURM_JOB_DIR": str(tmp_path / "jobs")}
    return subprocess.run(["bash", str(script)], env={**base, **env}, capture_output=True, text=True, check=False)


def files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if not p.name.startswith(".")}


def test_the_prolog_writes_the_gpu_mapping_and_the_jobs_facts(tmp_path: Path) -> None:
    done = run(PROLOG, tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", SLURM_JOB_USER="alice",
               SLURM_JOB_ACCOUNT="vision", SLURM_JOB_PARTITION="gpu", CUDA_VISIBLE_DEVICES="0,1,3",
               SLURM_JOB_GPUS="0,1,3", SLURM_JOB_COMMENT="team=vision,project=defect-detection")  # fmt: skip
    assert done.returncode == 0 and done.stderr == ""
    assert files(tmp_path / "gpustat") == {"0": "4242 1001\n", "1": "4242 1001\n", "3": "4242 1001\n"}
    assert files(tmp_path / "jobs") == {
        "4242.job": "job=4242\nuid=1001\nuser=alice\naccount=vision\npartition=gpu\ngpus=0,1,3\n"
        "comment=team=vision,project=defect-detection\n"
    }
    assert oct((tmp_path / "gpustat" / "0").stat().st_mode & 0o777) == "0o644"  # readable by a non-root agent


def test_slurm_job_gpus_stands_in_when_cuda_visible_devices_is_not_set(tmp_path: Path) -> None:
    assert run(PROLOG, tmp_path, SLURM_JOB_ID="7", SLURM_JOB_UID="1001", SLURM_JOB_GPUS="2").returncode == 0
    assert files(tmp_path / "gpustat") == {"2": "7 1001\n"}
    assert "gpus=2\n" in (tmp_path / "jobs" / "7.job").read_text()


def test_a_job_without_gpu_variables_says_nothing_of_its_gpus(tmp_path: Path) -> None:
    assert run(PROLOG, tmp_path, SLURM_JOB_ID="8", SLURM_JOB_UID="1001", SLURM_JOB_ACCOUNT="cpu").returncode == 0
    assert files(tmp_path / "gpustat") == {}
    assert "gpus=" not in (tmp_path / "jobs" / "8.job").read_text()  # unknown, not "none"


def test_mig_uuids_name_their_files_and_anything_else_is_no_file(tmp_path: Path) -> None:
    done = run(PROLOG, tmp_path, SLURM_JOB_ID="9", SLURM_JOB_UID="1001",
               CUDA_VISIBLE_DEVICES="MIG-5f2d8e21-aaaa, ../../escape,NoDevFiles,/dev/nvidia0,GPU-0b3a1c4e")  # fmt: skip
    assert done.returncode == 0
    assert files(tmp_path / "gpustat") == {"MIG-5f2d8e21-aaaa": "9 1001\n", "GPU-0b3a1c4e": "9 1001\n"}
    assert not (tmp_path / "escape").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["gpustat", "jobs"]


def test_a_comment_is_one_line_of_data_never_run(tmp_path: Path) -> None:
    comment = "team=vision\nproject=x $(touch pwned) `touch pwned2`\r"
    done = run(PROLOG, tmp_path, SLURM_JOB_ID="10", SLURM_JOB_UID="1001", SLURM_JOB_COMMENT=comment)
    assert done.returncode == 0
    text = (tmp_path / "jobs" / "10.job").read_text()
    assert "comment=team=vision project=x $(touch pwned) `touch pwned2` \n" in text
    assert not list(tmp_path.rglob("pwned*"))


def test_jobs_sharing_a_gpu_each_keep_their_line_until_their_epilog(tmp_path: Path) -> None:
    run(PROLOG, tmp_path, SLURM_JOB_ID="20", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0,1")
    run(PROLOG, tmp_path, SLURM_JOB_ID="21", SLURM_JOB_UID="1002", CUDA_VISIBLE_DEVICES="1")
    run(PROLOG, tmp_path, SLURM_JOB_ID="20", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0,1")  # run twice: no twin
    assert files(tmp_path / "gpustat") == {"0": "20 1001\n", "1": "21 1002\n20 1001\n"}
    done = run(EPILOG, tmp_path, SLURM_JOB_ID="20")
    assert done.returncode == 0 and done.stderr == ""
    assert files(tmp_path / "gpustat") == {"1": "21 1002\n"}
    assert files(tmp_path / "jobs") == {"21.job": (tmp_path / "jobs" / "21.job").read_text()}
    run(EPILOG, tmp_path, SLURM_JOB_ID="21")
    assert files(tmp_path / "gpustat") == {} and files(tmp_path / "jobs") == {}


def test_the_epilog_removes_a_job_id_not_its_prefix(tmp_path: Path) -> None:
    run(PROLOG, tmp_path, SLURM_JOB_ID="42", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0")
    run(PROLOG, tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0")
    run(EPILOG, tmp_path, SLURM_JOB_ID="42")
    assert files(tmp_path / "gpustat") == {"0": "4242 1001\n"}


def test_neither_script_ever_fails_the_job(tmp_path: Path) -> None:
    (tmp_path / "occupied").write_text("a file where the directory should be")
    env = {"GPULEDGER_GPUSTAT_DIR": str(tmp_path / "occupied" / "gpustat")}
    done = run(PROLOG, tmp_path, SLURM_JOB_ID="30", SLURM_JOB_UID="1001", CUDA_VISIBLE_DEVICES="0", **env)
    assert done.returncode == 0 and "cannot create" in done.stderr
    assert run(EPILOG, tmp_path, SLURM_JOB_ID="30", **env).returncode == 0
    no_job = run(PROLOG, tmp_path)
    assert no_job.returncode == 0 and "no numeric SLURM_JOB_ID" in no_job.stderr
    assert not (tmp_path / "gpustat").exists()
    assert run(EPILOG, tmp_path, SLURM_JOB_ID="31").returncode == 0  # nothing of it to remove


def test_the_scripts_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        missing("shellcheck", "apt-get install shellcheck")
    done = subprocess.run([str(shellcheck), str(PROLOG), str(EPILOG)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("script", [PROLOG, EPILOG])
def test_the_scripts_are_executable(script: Path) -> None:
    assert script.stat().st_mode & 0o111 == 0o111  # slurmd execs Prolog= / Epilog= directly
