"""Docker adapter, pure parts: what an inspect document, an event and DOCKER_HOST say.

The inspect documents are real answers of Docker Engine 20.10 (tests/data/docker/README.md); the
device requests of ``inspect_created_gpus.json`` are the daemon's own for ``docker create --gpus``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.redaction.redact import Redactor
from gpuledger.node.claims import Allocation, ContainerClaim
from gpuledger.node.docker_api import DockerConfigError, docker_host
from gpuledger.node.docker_inspect import (
    allocations,
    claim_from_event,
    claim_from_inspect,
    container_gpus,
    docker_time,
    docker_time_ns,
    gpus_from_cdi_annotations,
    gpus_from_device_requests,
    gpus_from_env,
    gpus_from_mounts,
)

DATA = Path(__file__).parent / "data" / "docker"
UUID_B = "GPU-0b3a1c4e-5f06-4d7e-9a8b-2c1d0e9f8a7b"
NODE = dict(enumerate(["GPU-11111111-aaaa", UUID_B, "GPU-33333333-cccc"]))  # NVML index -> UUID


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor.default()


# -- inspect documents ------------------------------------------------------------------------------
def test_a_running_container_claims_its_labels_env_gpus_and_host_pid(redactor: Redactor) -> None:
    claim = claim_from_inspect(load("inspect_running_env.json"), redactor)
    assert claim is not None
    assert claim.id == load("inspect_running_env.json")["Id"] and claim.name == "trainer-env"
    assert claim.image == "local/busybox:test"
    assert claim.labels["team"] == "vision"
    assert claim.labels["project"] == "defect-detection"
    assert claim.labels["model_version"] == "yolov10s"
    assert claim.gpus == ("0", UUID_B)
    assert claim.pid == 19224
    assert claim.started_at == pytest.approx(docker_time("2026-12-01T13:04:25.2047151Z"))
    assert claim.finished_at is None and claim.exit_code is None


def test_a_secret_in_a_label_is_redacted_before_it_is_kept(redactor: Redactor) -> None:
    claim = claim_from_inspect(load("inspect_running_env.json"), redactor)
    assert claim is not None
    assert "0123456789abcdef" not in json.dumps(dict(claim.labels))
    assert claim.labels["wandb_api_key"].startswith("[REDACTED:")


def test_an_exited_container_has_its_exit_code_and_end(redactor: Redactor) -> None:
    claim = claim_from_inspect(load("inspect_exited.json"), redactor)
    assert claim is not None
    assert claim.exit_code == 3
    assert claim.finished_at == pytest.approx(docker_time("2026-12-01T13:04:26.209577058Z"))
    assert claim.pid is None  # Docker reports Pid 0 once it stopped


def test_a_container_that_never_started_claims_nothing(redactor: Redactor) -> None:
    assert claim_from_inspect(load("inspect_created_gpus.json"), redactor) is None


def test_a_fast_exit_stamped_before_its_start_ends_at_its_start(redactor: Redactor) -> None:
    doc = load("inspect_exited.json")
    doc["State"]["FinishedAt"] = "2026-12-01T13:04:25.2040000Z"  # seen on Engine 20.10 for a quick exit
    claim = claim_from_inspect(doc, redactor)
    assert claim is not None and claim.finished_at == claim.started_at


# -- GPUs: device requests and NVIDIA_VISIBLE_DEVICES -----------------------------------------------
def test_the_daemons_device_requests_for_gpus_device_ids() -> None:
    doc = load("inspect_created_gpus.json")
    assert container_gpus(doc) == ("1", UUID_B)


@pytest.mark.parametrize(
    ("requests", "gpus"),
    [
        # docker run --gpus all / --gpus 2 (as the daemon records them; see the README)
        ([{"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}], ("all",)),
        ([{"Driver": "", "Count": 2, "DeviceIDs": None, "Capabilities": [["gpu"]], "Options": {}}], ("0", "1")),
        # --gpus 'driver=nvidia,count=1' and the Count 0 "void" case
        ([{"Driver": "nvidia", "Count": 1, "Capabilities": [["gpu", "utility"]]}], ("0",)),
        ([{"Driver": "nvidia", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]]}], ()),
        # CDI (Docker 25+): --device nvidia.com/gpu=all, =<uuid>, =<index>
        ([{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}], ("all",)),
        ([{"Driver": "cdi", "DeviceIDs": [f"nvidia.com/gpu={UUID_B}", "nvidia.com/gpu=2"]}], (UUID_B, "2")),
        # two requests add up; "all" swallows the rest
        ([{"Driver": "nvidia", "DeviceIDs": ["0"]}, {"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=2"]}], ("0", "2")),
        ([{"Driver": "nvidia", "DeviceIDs": ["0"]}, {"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}], ("all",)),
    ],
)
def test_device_requests(requests: list, gpus: tuple) -> None:
    assert gpus_from_device_requests(requests) == gpus


def test_device_requests_for_other_devices_are_not_gpus() -> None:
    other = [{"Driver": "cdi", "DeviceIDs": ["vendor1.com/device=foo"]}, {"Driver": "", "Capabilities": [["tpu"]]}]
    assert gpus_from_device_requests(other) is None
    assert gpus_from_device_requests(None) is None


def test_device_requests_win_over_the_images_environment() -> None:
    # CUDA images set NVIDIA_VISIBLE_DEVICES=all in their environment; --gpus decides.
    doc = copy.deepcopy(load("inspect_running_env.json"))
    doc["Config"]["Env"].append("NVIDIA_VISIBLE_DEVICES=all")
    doc["HostConfig"]["DeviceRequests"] = load("inspect_created_gpus.json")["HostConfig"]["DeviceRequests"]
    assert container_gpus(doc) == ("1", UUID_B)
    doc["HostConfig"]["DeviceRequests"] = None
    assert container_gpus(doc) == ("all",)  # the last NVIDIA_VISIBLE_DEVICES wins


@pytest.mark.parametrize(
    ("env", "gpus"),
    [
        (["PATH=/bin"], None),
        (["NVIDIA_VISIBLE_DEVICES=all"], ("all",)),
        (["NVIDIA_VISIBLE_DEVICES=none"], ()),
        (["NVIDIA_VISIBLE_DEVICES=void"], ()),
        (["NVIDIA_VISIBLE_DEVICES="], ()),
        (["NVIDIA_VISIBLE_DEVICES=0, 2 ,0"], ("0", "2")),
        ([f"NVIDIA_VISIBLE_DEVICES=MIG-{UUID_B[4:]}"], (f"MIG-{UUID_B[4:]}",)),
    ],
)
def test_nvidia_visible_devices(env: list, gpus: tuple | None) -> None:
    assert gpus_from_env(env) == gpus


# -- GPUs: CDI annotations, device mounts, old CUDA images (NVIDIA container toolkit) ----------------
def _bind(source: str, destination: str) -> dict:
    """A ``Mounts`` entry as the daemon reports a ``-v source:destination:ro`` bind."""
    return {
        "Type": "bind",
        "Source": source,
        "Destination": destination,
        "Mode": "ro",
        "RW": False,
        "Propagation": "rprivate",
    }


def _doc(env: list[str] | None = None, **host: object) -> dict:
    doc = copy.deepcopy(load("inspect_running_env.json"))
    doc["Config"]["Env"] = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", *(env or [])]
    doc["HostConfig"].update({"DeviceRequests": None, "Runtime": "runc", **host})
    return doc


DEV = "/var/run/nvidia-container-devices"


@pytest.mark.parametrize(
    ("annotations", "gpus"),
    [
        ({"cdi.k8s.io/gpu": "nvidia.com/gpu=0"}, ("0",)),
        (
            {"cdi.k8s.io/b": f"nvidia.com/gpu={UUID_B}", "cdi.k8s.io/a": "nvidia.com/gpu=2,vendor.com/nic=1"},
            ("2", UUID_B),
        ),
        ({"cdi.k8s.io/all": "nvidia.com/gpu=all"}, ("all",)),
        ({"cdi.k8s.io/nic": "vendor.com/nic=1", "team": "nvidia.com/gpu=1"}, None),  # no GPU; not a CDI key
    ],
)
def test_cdi_annotations(annotations: dict, gpus: tuple | None) -> None:
    assert gpus_from_cdi_annotations(annotations) == gpus


def test_cdi_annotations_win_over_the_environment() -> None:
    doc = _doc(["NVIDIA_VISIBLE_DEVICES=all"], Annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=1"})
    assert container_gpus(doc) == ("1",)


@pytest.mark.parametrize(
    ("mounts", "gpus"),
    [
        ([_bind("/dev/null", f"{DEV}/1")], ("1",)),
        ([_bind("/dev/null", f"{DEV}/{UUID_B}"), _bind("/dev/null", f"{DEV}/0/")], (UUID_B, "0")),
        ([_bind("/dev/null", f"{DEV}/all")], ("all",)),
        (
            [_bind("/dev/null", f"{DEV}/cdi/nvidia.com/gpu/2"), _bind("/dev/null", f"{DEV}/cdi/nvidia.com/gpu=0")],
            ("2", "0"),
        ),
        ([_bind("/dev/null", f"{DEV}/imex/channel0"), _bind("/dev/null", f"{DEV}/cdi/vendor.com/nic/1")], None),
        ([_bind("/srv/data", f"{DEV}/1"), _bind("/dev/null", "/var/run/other/1"), _bind("/dev/null", DEV)], None),
    ],
)
def test_device_mounts(mounts: list, gpus: tuple | None) -> None:
    assert gpus_from_mounts(mounts) == gpus


def test_device_mounts_win_over_the_environment() -> None:
    # With mounts the toolkit takes them and ignores NVIDIA_VISIBLE_DEVICES (a CUDA image's "all").
    doc = _doc(["NVIDIA_VISIBLE_DEVICES=all"])
    doc["Mounts"] = [_bind("/dev/null", f"{DEV}/1")]
    assert container_gpus(doc) == ("1",)


@pytest.mark.parametrize(
    ("env", "runtime", "gpus"),
    [
        (["CUDA_VERSION=9.0.176"], "nvidia", ("all",)),  # an old CUDA image: every GPU
        (["CUDA_VERSION=9.0.176"], "nvidia-legacy", ("all",)),
        (["CUDA_VERSION=9.0.176"], "runc", None),  # nothing injects GPUs
        (["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"], "nvidia", None),  # not legacy
        (["CUDA_VERSION=9.0.176", "NVIDIA_VISIBLE_DEVICES=void"], "nvidia", ()),  # the variable decides
        (["CUDA_VERSION=12.4.1", "NVIDIA_REQUIRE_CUDA=cuda>=12.4", "NVIDIA_VISIBLE_DEVICES=all"], "nvidia", ("all",)),
    ],
)
def test_old_cuda_images_under_the_nvidia_runtime(env: list, runtime: str, gpus: tuple | None) -> None:
    assert container_gpus(_doc(env, Runtime=runtime)) == gpus


def test_cdi_names_in_nvidia_visible_devices() -> None:
    assert gpus_from_env([f"NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1,nvidia.com/gpu={UUID_B}"]) == ("1", UUID_B)


# -- allocations -------------------------------------------------------------------------------------
def _claim(*gpus: str) -> ContainerClaim:
    return ContainerClaim(id="c" * 64, gpus=gpus)


def test_one_allocation_per_gpu_given_indices_resolved_in_nvml_order() -> None:
    found, missing = allocations(_claim("2", UUID_B, "0"), NODE)
    assert found == [Allocation(gpu, "container", "c" * 64) for gpu in (NODE[2], UUID_B, NODE[0])]
    assert missing == []


def test_all_means_every_gpu_of_the_node() -> None:
    found, _ = allocations(_claim("all"), NODE)
    assert [a.gpu for a in found] == list(NODE.values())


def test_ids_that_cannot_be_resolved_are_said_not_guessed() -> None:
    found, missing = allocations(_claim("7", "0:1", UUID_B), NODE)  # no GPU 7; a MIG index pair
    assert [a.gpu for a in found] == [UUID_B]
    assert missing == ["7", "0:1"]
    found, missing = allocations(_claim("0", "all"), None)  # no GPU list at all
    assert found == [] and missing == ["0", "all"]


@given(st.lists(st.sampled_from(["0", "1", "2", UUID_B, "all"]), max_size=6))
def test_a_gpu_is_allocated_once_whatever_the_list(tokens: list[str]) -> None:
    found, _ = allocations(_claim(*tokens), NODE)
    gpus = [a.gpu for a in found]
    assert len(gpus) == len(set(gpus)) and set(gpus) <= set(NODE.values())


# -- events ------------------------------------------------------------------------------------------
DIE = {  # an event as Engine 20.10 streams it for `docker run --rm --label team=vision ... exit 3`
    "status": "die",
    "id": "e92db5759b19cd6df836f7bf9bf1bc84ef2cbe453b0f29d49aaab49ffa877efd",
    "from": "local/busybox:test",
    "Type": "container",
    "Action": "die",
    "Actor": {
        "ID": "e92db5759b19cd6df836f7bf9bf1bc84ef2cbe453b0f29d49aaab49ffa877efd",
        "Attributes": {"exitCode": "3", "image": "local/busybox:test", "name": "frosty_galois", "team": "vision"},
    },
    "scope": "local",
    "time": 1796130068,
    "timeNano": 1796130068339839899,
}


def test_a_die_event_alone_gives_the_exit_code_time_and_labels(redactor: Redactor) -> None:
    claim = claim_from_event(DIE, redactor)
    assert claim is not None
    assert claim.exit_code == 3 and claim.finished_at == pytest.approx(1796130068.339839899)
    assert claim.labels == {"team": "vision"} and claim.name == "frosty_galois"


# -- times and DOCKER_HOST ---------------------------------------------------------------------------
def test_docker_times() -> None:
    assert docker_time_ns("2026-12-01T12:59:51.481720880Z") == 1796129991_481720880
    assert docker_time_ns("2026-12-01T13:59:51.48172088+01:00") == 1796129991_481720880
    assert docker_time_ns("2026-12-01T12:59:51Z") == 1796129991_000000000
    assert docker_time_ns("0001-01-01T00:00:00Z") is None
    assert docker_time_ns("yesterday") is None


def test_docker_host() -> None:
    assert docker_host({}) == ("http://docker", "/var/run/docker.sock")
    assert docker_host({"DOCKER_HOST": "unix:///run/user/1000/docker.sock"})[1] == "/run/user/1000/docker.sock"
    assert docker_host({"DOCKER_HOST": "tcp://socket-proxy:2375"}) == ("http://socket-proxy:2375", None)
    assert docker_host({"DOCKER_HOST": "tcp://localhost"}) == ("http://localhost:2375", None)
    for bad in ({"DOCKER_HOST": "ssh://me@node"}, {"DOCKER_HOST": "tcp://h:2376", "DOCKER_TLS_VERIFY": "1"}):
        with pytest.raises(DockerConfigError, match="DOCKER_"):
            docker_host(bad)
