"""Docker adapter against a real Docker engine (tests/docker_support.py starts a private dockerd).

What the agent relies on: a container's labels, GPUs and host pid; its start and death with the
exit code, even when it lived and was removed between two agent ticks; its log parsed into YOLO
epochs, with or without a TTY; the daemon restarting under the adapter; a read-only socket proxy.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from docker_support import (
    IMAGE,
    YOLO_DATA,
    Engine,
    GetOnlyProxy,
    long_progress,
    wait_for,
)
from gpuledger.collect.fake_nvml import FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.training.logparse import parse_log
from gpuledger.node.claims import ContainerClaim, SourceOptions
from gpuledger.node.docker import DockerSource, open_source
from gpuledger.node.docker_api import DockerClient
from gpuledger.node.docker_inspect import container_gpus
from nvml_support import Clock, ideal

pytestmark = pytest.mark.slow

NODE = ["GPU-5f0b7a1e-0000-4000-8000-000000000000", "GPU-5f0b7a1e-1111-4000-8000-111111111111"]
LABELS = {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}
LABEL_ARGS = [arg for k, v in LABELS.items() for arg in ("--label", f"{k}={v}")]
GiB = 2**30


@pytest.fixture
def source(engine: Engine, tmp_path: Path):
    src = DockerSource(engine.env, gpu_uuids=NODE, log_dir=tmp_path / "logs", max_backoff_s=0.5)
    assert src.wait_synced(30), src.status()
    yield src
    src.close()


def now_claims(src: DockerSource) -> dict[str, ContainerClaim]:
    return src.claims(time.time()).containers


def named(src: DockerSource, name: str) -> ContainerClaim | None:
    return next((c for c in now_claims(src).values() if c.name == name), None)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- what a running container claims -----------------------------------------------------------------
def test_a_labelled_container_claims_its_labels_gpus_and_host_pid(engine: Engine, source: DockerSource) -> None:
    cid = engine.run(*LABEL_ARGS, "-e", f"NVIDIA_VISIBLE_DEVICES=1,{NODE[0]}", IMAGE, "sleep", "60")
    claim = wait_for(lambda: now_claims(source).get(cid), what="the container's claim")
    assert dict(claim.labels) == LABELS
    assert claim.image == IMAGE and claim.name == engine.inspect(cid, "{{.Name}}").lstrip("/")
    assert claim.gpus == ("1", NODE[0])
    assert claim.finished_at is None and claim.started_at is not None
    allocations = source.claims(time.time()).allocations
    assert {(a.gpu, a.kind, a.owner) for a in allocations} == {(NODE[1], "container", cid), (NODE[0], "container", cid)}
    # The host pid, the one NVML reports: it is State.Pid and its cgroup names the container.
    assert claim.pid == int(engine.inspect(cid, "{{.State.Pid}}"))
    assert cid in Path(f"/proc/{claim.pid}/cgroup").read_text()


def test_the_containers_host_pid_is_the_one_nvml_reports(engine: Engine, source: DockerSource) -> None:
    cid = engine.run(*LABEL_ARGS, "-e", "NVIDIA_VISIBLE_DEVICES=1", IMAGE, "sleep", "60")
    claim = wait_for(lambda: now_claims(source).get(cid), what="the container's claim")
    assert claim.pid is not None
    # The driver lists host pids; a scripted GPU runs the container's process.
    procs = {claim.pid: (3 * GiB, 85.0)}
    gpus = [ideal(NODE[0], points=[TracePoint(0)]), ideal(NODE[1], points=[TracePoint(0, util_pct=90, procs=procs)])]
    clock = Clock()
    collector = NvmlCollector(nvml=FakeNvml(gpus, clock=clock, start=clock.t), clock=clock, all_processes=True)
    collector.read(set(), clock.t)
    clock.t += 1
    seen = collector.read(set(), clock.t).processes
    owners = {a.gpu: a.owner for a in source.claims(time.time()).allocations}
    assert [(p.uuid, p.pid, owners.get(p.uuid)) for p in seen] == [(NODE[1], claim.pid, cid)]


def test_device_requests_as_the_daemon_records_them(engine: Engine) -> None:
    # `--gpus` cannot start here (no NVIDIA runtime), but `docker create` stores the request.
    client = DockerClient(engine.env)
    try:
        for flag, gpus in (("all", ("all",)), ("2", ("0", "1")), (f'"device=1,{NODE[0]}"', ("1", NODE[0]))):
            cid = engine.docker("create", "--gpus", flag, IMAGE, "true").stdout.strip()
            engine.containers.add(cid)
            doc = client.inspect(cid)
            assert doc is not None and container_gpus(doc) == gpus
    finally:
        client.close()


def test_gpus_passed_as_device_mounts_or_by_an_old_cuda_image_under_the_nvidia_runtime(engine: Engine) -> None:
    """Hardened nodes pass GPUs as /dev/null mounts under /var/run/nvidia-container-devices (the
    toolkit then ignores the environment); an old CUDA image (CUDA_VERSION, no
    NVIDIA_VISIBLE_DEVICES) gets every GPU from the NVIDIA runtime, and none from runc."""
    client = DockerClient(engine.env)
    try:
        mounted = engine.docker(
            "create",
            *("-v", f"/dev/null:/var/run/nvidia-container-devices/{NODE[1]}:ro"),
            *("-v", "/dev/null:/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0:ro"),
            *("-e", "NVIDIA_VISIBLE_DEVICES=all", IMAGE, "true"),
        ).stdout.strip()
        old_cuda = ["-e", "CUDA_VERSION=9.0.176", IMAGE, "true"]
        legacy = engine.docker("create", "--runtime", "nvidia", *old_cuda).stdout.strip()
        plain = engine.docker("create", *old_cuda).stdout.strip()
        engine.containers.update({mounted, legacy, plain})
        gpus = {cid: container_gpus(client.inspect(cid) or {}) for cid in (mounted, legacy, plain)}
        # Docker lists a container's Mounts in no fixed order (its inspect builds them from a map)
        assert sorted(gpus.pop(mounted) or ()) == sorted((NODE[1], "0"))
        assert gpus == {legacy: ("all",), plain: None}
    finally:
        client.close()


# -- start and die -----------------------------------------------------------------------------------
def test_a_container_gone_between_two_ticks_keeps_its_exit_code(engine: Engine, source: DockerSource) -> None:
    name = unique("short")
    source.claims(time.time())  # a tick before it exists
    done = engine.docker(
        "run", "--rm", "--name", name, "--network", "none", *LABEL_ARGS, IMAGE, "sh", "-c", "exit 3", check=False
    )
    assert done.returncode == 3  # docker run exits with the container's code
    assert engine.docker("inspect", name, check=False).returncode != 0  # removed before the next tick
    claim = wait_for(lambda: (c := named(source, name)) and c.exit_code is not None and c, what="its die event")
    assert claim.exit_code == 3
    assert claim.started_at is not None and claim.finished_at is not None and claim.finished_at >= claim.started_at
    assert dict(claim.labels) == LABELS


def test_the_exit_code_comes_from_the_event_when_the_container_is_gone_before_inspection(engine: Engine) -> None:
    proxy = GetOnlyProxy(engine.sock)  # holds inspect requests: an agent slower than `docker run --rm`
    src = DockerSource({"DOCKER_HOST": proxy.url}, max_backoff_s=0.5)
    try:
        assert src.wait_synced(30), src.status()
        name = unique("gone")
        proxy.inspect_gate.clear()
        args = ["run", "--rm", "--name", name, "--network", "none", *LABEL_ARGS, IMAGE, "sh", "-c", "exit 5"]
        assert engine.docker(*args, check=False).returncode == 5
        proxy.inspect_gate.set()
        claim = wait_for(lambda: (c := named(src, name)) and c.exit_code is not None and c, what="its die event")
        assert claim.exit_code == 5 and dict(claim.labels) == LABELS and claim.finished_at is not None
    finally:
        proxy.inspect_gate.set()
        src.close()
        proxy.close()


def test_a_container_is_running_then_stopped_with_its_exit_code(engine: Engine, source: DockerSource) -> None:
    cid = engine.run("-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sh", "-c", "sleep 2; exit 7")
    running = wait_for(lambda: now_claims(source).get(cid), what="its start")
    assert running.finished_at is None and running.exit_code is None
    assert [a.owner for a in source.claims(time.time()).allocations] == [cid]
    stopped = wait_for(lambda: (c := now_claims(source).get(cid)) and c.finished_at and c, what="its death")
    assert stopped.exit_code == 7 and stopped.pid == running.pid
    assert source.claims(time.time()).allocations == []  # a stopped container may use no GPU
    # Forgotten once it has been stopped longer than keep_finished_s.
    assert cid not in source.claims(stopped.finished_at + 3601).containers


# -- logs --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("tty", "stream"), [(False, "stderr"), (False, "stdout"), (True, "stdout")])
def test_an_unwrapped_yolo_container_gets_its_epochs(
    engine: Engine, source: DockerSource, tmp_path: Path, tty: bool, stream: str
) -> None:
    data = long_progress((YOLO_DATA / "yolov8n_detect.log").read_bytes())  # lines past 16 KiB: partial messages
    (tmp_path / "train.log").write_bytes(data)
    command = "cat /data/train.log" + (" >&2" if stream == "stderr" else "")
    flags = ["-t"] if tty else []
    cid = engine.run(*flags, "-v", f"{tmp_path}:/data:ro", "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sh", "-c", command)
    wait_for(lambda: (log := source.log(cid)) and log.view().done, what="its log read to the end")
    view = source.log(cid).view()  # type: ignore[union-attr]
    expected = parse_log(data)
    assert len(expected.epochs) == 2
    assert view.parsed.epochs == expected.epochs and view.parsed.final == expected.final
    assert sorted(view.epoch_times) == [1, 2] and view.error is None
    # The copy is what the docker CLI shows (both decode the same stream; the daemon itself
    # replaces a UTF-8 character cut at a 16 KiB boundary with U+FFFD, so not the input byte for byte).
    shown = engine.docker("logs", cid, text=False)
    assert view.path.read_bytes() == shown.stdout + shown.stderr  # type: ignore[union-attr]


def test_a_follow_that_ends_before_the_last_lines_is_read_to_the_end(engine: Engine, tmp_path: Path) -> None:
    """The daemon may close the follow of a container that exits at once before it has sent the
    last lines (seen once in CI): the adapter reads what is left without follow before it says done."""
    proxy = GetOnlyProxy(engine.sock)
    proxy.cut_follow_b = 1024  # every followed log ends cleanly after 1 KiB of its body
    src = DockerSource({"DOCKER_HOST": proxy.url}, gpu_uuids=NODE, max_backoff_s=0.5)
    try:
        assert src.wait_synced(30), src.status()
        data = (YOLO_DATA / "yolov8n_detect.log").read_bytes()
        assert len(data) > 3 * 1024
        (tmp_path / "train.log").write_bytes(data)
        mount = ["-v", f"{tmp_path}:/data:ro", "-e", "NVIDIA_VISIBLE_DEVICES=0"]
        cid = engine.run(*mount, IMAGE, "sh", "-c", "cat /data/train.log")
        wait_for(lambda: (log := src.log(cid)) and log.view().done, what="its log read to the end")
        view = src.log(cid).view()  # type: ignore[union-attr]
        expected = parse_log(data)
        assert view.parsed.epochs == expected.epochs and view.bytes == len(data)
    finally:
        src.close()
        proxy.close()


def test_any_container_can_be_followed_on_request(engine: Engine, source: DockerSource, tmp_path: Path) -> None:
    (tmp_path / "train.log").write_bytes((YOLO_DATA / "yolo26n_detect.log").read_bytes())
    cid = engine.run("-v", f"{tmp_path}:/data:ro", IMAGE, "sh", "-c", "cat /data/train.log; sleep 1")
    wait_for(lambda: now_claims(source).get(cid), what="its claim")
    assert source.log(cid) is None  # no GPU claimed: not followed by default
    log = source.follow(cid)
    assert log is not None
    wait_for(lambda: log.view().done, what="its log")
    assert log.view().parsed.epochs == parse_log((YOLO_DATA / "yolo26n_detect.log").read_bytes()).epochs


# -- the daemon restarting -----------------------------------------------------------------------------
def test_the_adapter_survives_the_daemon_restarting(engine: Engine, source: DockerSource) -> None:
    before = engine.run(*LABEL_ARGS, "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sh", "-c", "echo hello; sleep 300")
    wait_for(lambda: (c := now_claims(source).get(before)) and c.finished_at is None, what="its start")
    assert source.status() is None
    engine.stop()  # the daemon kills its containers on the way down
    status = wait_for(lambda: (s := source.status()) and "unreachable" in s and s, what="status to say so")
    # refused, gone, or cut mid-answer (a request in flight as the daemon went down): the cause named
    causes = ("connection refused", "no Docker socket", "peer closed connection")
    assert any(cause in status for cause in causes), status
    assert before in now_claims(source)  # what it last knew, without raising
    engine.start()
    wait_for(lambda: source.status() is None and source.reconnects >= 1, what="the adapter to reconnect")
    dead = wait_for(lambda: (c := now_claims(source).get(before)) and c.finished_at and c, what="the re-list")
    assert dead.exit_code is not None and dead.exit_code != 0
    after = engine.run("--label", "team=after", IMAGE, "sleep", "60")  # events flow again
    assert wait_for(lambda: now_claims(source).get(after), what="a container started after").labels == {"team": "after"}
    log = source.log(before)
    assert log is not None
    wait_for(lambda: log.view().done, what="the first container's log to end")
    assert log.view().lines == 1 and log.view().path.read_bytes() == b"hello\n"  # type: ignore[union-attr]


# -- a read-only socket proxy ------------------------------------------------------------------------
def test_the_adapter_works_through_a_get_only_proxy(engine: Engine, tmp_path: Path) -> None:
    proxy = GetOnlyProxy(engine.sock)
    src = DockerSource({"DOCKER_HOST": proxy.url}, gpu_uuids=NODE, max_backoff_s=0.5)
    try:
        assert src.wait_synced(30), src.status()
        (tmp_path / "train.log").write_bytes((YOLO_DATA / "yolov8n_detect_piped.log").read_bytes())
        mount = ["-v", f"{tmp_path}:/data:ro", "-e", "NVIDIA_VISIBLE_DEVICES=0"]
        cid = engine.run(*LABEL_ARGS, *mount, IMAGE, "sh", "-c", "cat /data/*; exit 4")
        claim = wait_for(lambda: (c := now_claims(src).get(cid)) and c.exit_code is not None and c, what="its death")
        assert claim.exit_code == 4 and dict(claim.labels) == LABELS
        wait_for(lambda: (log := src.log(cid)) and log.view().done, what="its log")
        assert len(src.log(cid).view().parsed.epochs) == 3  # type: ignore[union-attr]
        assert {m for m, _, _ in proxy.seen} == {"GET"} and all(s == 200 for *_, s in proxy.seen)
        # A proxy that refuses logs: claims go on, status says what is missing.
        proxy.deny_logs = True
        name = unique("nolog")
        engine.run("--name", name, "-e", "NVIDIA_VISIBLE_DEVICES=0", IMAGE, "sleep", "60")
        status = wait_for(lambda: (s := src.status()) and name in s and s, what="status naming the unreadable log")
        assert "403" in status and named(src, name) is not None
    finally:
        src.close()
        proxy.close()


# -- the API version, and log framing on the real engine ---------------------------------------------
def test_the_daemons_own_api_version_is_spoken_on_every_path(engine: Engine, tmp_path: Path) -> None:
    """Versioned paths at the daemon's own version (Engine 29 refuses unversioned old clients),
    and logs with and without a TTY framed right at that version: Engine 20.10 (API 1.41) sends
    no ``Content-Type`` with a log, so its TTY flag decides (test_node_docker_api.py: newer ones)."""
    daemons = engine.docker("version", "-f", "{{.Server.APIVersion}}").stdout.strip()
    proxy = GetOnlyProxy(engine.sock)
    src = DockerSource({"DOCKER_HOST": proxy.url}, gpu_uuids=NODE, log_dir=tmp_path / "logs", max_backoff_s=0.5)
    try:
        assert src.wait_synced(30), src.status()
        assert src._client is not None and src._client.api_version == tuple(int(x) for x in daemons.split("."))
        ids = [engine.run(*flags, IMAGE, "sh", "-c", "echo one; echo two >&2") for flags in ([], ["-t"])]
        for cid in ids:
            log = wait_for(lambda cid=cid: (log := src.log(cid) or src.follow(cid)) and log.view().done and log)
            assert log.view().lines == 2 and log.view().error is None
            text = log.view().path.read_bytes()  # type: ignore[union-attr]
            assert sorted(text.replace(b"\r", b"").splitlines()) == [b"one", b"two"]
        asked = [p for _, p, _ in proxy.seen if p not in ("/_ping", "/version")]
        assert asked and all(p.startswith(f"/v{daemons}/") for p in asked), asked
    finally:
        src.close()
        proxy.close()


# -- no daemon ---------------------------------------------------------------------------------------
def test_no_daemon_is_said_not_raised(tmp_path: Path) -> None:
    src = DockerSource({"DOCKER_HOST": f"unix://{tmp_path}/docker.sock"}, max_backoff_s=0.2)
    try:
        status = wait_for(lambda: (s := src.status()) and "no Docker socket" in s and s, what="the status")
        assert f"{tmp_path}/docker.sock" in status
        assert src.claims(time.time()).containers == {}
    finally:
        src.close()
    bad = DockerSource({"DOCKER_HOST": "ssh://me@gpu-node"})
    assert "DOCKER_HOST=ssh://me@gpu-node" in (bad.status() or "") and bad.claims(0.0).containers == {}
    bad.close()


def test_open_source_takes_the_agents_options(engine: Engine) -> None:
    options = SourceOptions(docker_socket=str(engine.sock), gpus=((1, NODE[1]), (0, NODE[0])))
    src = open_source(options, env={})
    try:
        assert src.status() is None  # opening waits for the first listing
        cid = engine.run("-e", "NVIDIA_VISIBLE_DEVICES=1", IMAGE, "sleep", "60")
        wait_for(lambda: now_claims(src).get(cid), what="its claim")
        assert [a.gpu for a in src.claims(time.time()).allocations] == [NODE[1]]
    finally:
        src.close()
    # The socket left at its default: DOCKER_HOST from the environment wins, as for the docker CLI.
    src = open_source(SourceOptions(), env=engine.env)
    try:
        assert src.status() is None and cid in now_claims(src)
    finally:
        src.close()
