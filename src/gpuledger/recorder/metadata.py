"""Who ran what, where: user, host, git state, versions and labels taken from the environment."""

from __future__ import annotations

import getpass
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpuledger.recorder.dist_versions import installed_versions

# Environment variables that identify the job around a run (scheduler, cluster, CI), as labels.
ENV_LABELS: dict[str, str] = {
    "SLURM_JOB_ID": "slurm_job_id",
    "SLURM_JOB_NAME": "slurm_job_name",
    "SLURM_ARRAY_JOB_ID": "slurm_array_job_id",
    "SLURM_ARRAY_TASK_ID": "slurm_array_task_id",
    "SLURM_CLUSTER_NAME": "slurm_cluster",
    "SLURM_JOB_PARTITION": "slurm_partition",
    "SLURM_JOB_ACCOUNT": "slurm_account",
    "POD_NAME": "k8s_pod",
    "POD_NAMESPACE": "k8s_namespace",
    "GITHUB_RUN_ID": "ci_github_run_id",
    "GITHUB_REPOSITORY": "ci_github_repository",
    "GITHUB_WORKFLOW": "ci_github_workflow",
    "CI_JOB_ID": "ci_gitlab_job_id",
    "CI_PIPELINE_ID": "ci_gitlab_pipeline_id",
    "BUILDKITE_BUILD_ID": "ci_buildkite_build_id",
    "CIRCLE_BUILD_NUM": "ci_circle_build_num",
    "BUILD_TAG": "ci_jenkins_build_tag",
    "GPULEDGER_INSTANCE_TYPE": "instance_type",
}
K8S_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
VERSION_PACKAGES = ("torch", "torchvision", "ultralytics", "numpy", "nvidia-ml-py")
GIT_TIMEOUT_S = 3.0


def current_user(env: Mapping[str, str]) -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return env.get("USER") or f"uid{os.getuid()}"


def parse_label(text: str) -> tuple[str, str]:
    """``key=value`` → (key, value); a clear error otherwise."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ValueError(f"label {text!r} is not of the form key=value")
    return key, value.strip()


def env_labels(env: Mapping[str, str]) -> dict[str, str]:
    labels = {label: env[var] for var, label in ENV_LABELS.items() if env.get(var)}
    if env.get("KUBERNETES_SERVICE_HOST"):
        labels.setdefault("k8s_pod", env.get("HOSTNAME", ""))
        if "k8s_namespace" not in labels and K8S_NAMESPACE_FILE.is_file():
            labels["k8s_namespace"] = K8S_NAMESPACE_FILE.read_text().strip()
    for var, label in (("GPULEDGER_PROJECT", "project"), ("GPULEDGER_TEAM", "team")):
        if env.get(var):
            labels[label] = env[var]
    for item in filter(None, (s.strip() for s in env.get("GPULEDGER_LABELS", "").split(","))):
        key, value = parse_label(item)
        labels[key] = value
    return {k: v for k, v in labels.items() if v}


def _git(cwd: str, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", cwd, *args],
            capture_output=True,
            # A branch or remote may hold bytes that are not UTF-8: kept as surrogate escapes (the
            # run record shows them as \xNN), never an error that leaves the run unmetered.
            encoding="utf-8",
            errors="surrogateescape",
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(cwd: str) -> dict[str, object]:
    """Commit, branch and dirty flag of the repository holding ``cwd`` ({} outside a repo), and
    its origin's URL. Two git processes in a work tree: ``status --porcelain=v2 --branch`` names
    the commit and the branch and lists the changed tracked files, then ``config`` the remote."""
    status = _git(cwd, "status", "--porcelain=v2", "--branch", "--untracked-files=no")
    if status is None:  # not a work tree (a bare repository?), or a git before 2.11: asked in parts
        return _git_state_in_parts(cwd)
    lines = status.splitlines()
    heads = dict(line[2:].partition(" ")[::2] for line in lines if line.startswith("# "))
    commit = heads.get("branch.oid")
    if not commit or commit == "(initial)":
        return {}  # no commit yet
    state: dict[str, object] = {"commit": commit}
    branch = heads.get("branch.head")
    if branch and branch != "(detached)":
        state["branch"] = branch
    state["dirty"] = any(line and not line.startswith("#") for line in lines)
    return _with_remote(cwd, state)


def _git_state_in_parts(cwd: str) -> dict[str, object]:
    commit = _git(cwd, "rev-parse", "HEAD")
    if commit is None:
        return {}
    state: dict[str, object] = {"commit": commit}
    branch = _git(cwd, "rev-parse", "--abbrev-ref", "HEAD")
    if branch and branch != "HEAD":
        state["branch"] = branch
    status = _git(cwd, "status", "--porcelain", "--untracked-files=no")
    if status is not None:
        state["dirty"] = bool(status)
    return _with_remote(cwd, state)


def _with_remote(cwd: str, state: dict[str, object]) -> dict[str, object]:
    remote = _git(cwd, "config", "--get", "remote.origin.url")
    if remote:
        state["remote"] = remote  # redacted by the caller: remotes can carry tokens
    return state


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    found.update(installed_versions(VERSION_PACKAGES))  # as importlib.metadata finds them, without it
    from gpuledger import __version__

    found["gpuledger"] = __version__
    return found
