"""A container path on the host through its mounts, as ``docker inspect`` lists them.

The ``Mounts`` entries below have the shape Docker Engine documents for ``GET /containers/{id}/json``
(``Type``, ``Name``, ``Source``, ``Destination``, ``Mode``, ``RW``, ``Propagation``): a bind mount's
``Source`` is the ``-v`` host path; a named (or a Dockerfile ``VOLUME``'s anonymous) volume's is
``<data-root>/volumes/<name>/_data``, the volume's ``Mountpoint``. The files are real, in tmp_path.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpuledger.node.container_mounts import ContainerFs, Mount, fs_from_inspect, read_file, to_host


def inspect_doc(tmp_path: Path) -> dict:
    return {
        "Config": {"WorkingDir": "/workspace"},
        "Mounts": [
            {"Type": "bind", "Source": str(tmp_path / "project"), "Destination": "/workspace", "Mode": "",
             "RW": True, "Propagation": "rprivate"},
            {"Type": "volume", "Name": "yolo-runs", "Source": str(tmp_path / "volumes" / "yolo-runs" / "_data"),
             "Destination": "/workspace/runs", "Driver": "local", "Mode": "z", "RW": True, "Propagation": ""},
            {"Type": "tmpfs", "Source": "", "Destination": "/scratch", "Mode": "", "RW": True, "Propagation": ""},
        ],
    }  # fmt: skip


def write(path: Path, data: bytes = b"epoch,time\n1,0.5\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_bind_mount_maps_its_destination_to_its_source(tmp_path: Path) -> None:
    fs = fs_from_inspect(inspect_doc(tmp_path))
    write(tmp_path / "project" / "out" / "train" / "results.csv")
    where = to_host("/workspace/out/train", fs)
    assert where is not None and where.mount.kind == "bind"
    assert str(where) == str(tmp_path / "project" / "out" / "train")
    assert read_file(where, "results.csv", max_b=1000) == b"epoch,time\n1,0.5\n"


def test_a_named_volume_nested_in_a_bind_wins_as_the_longest_destination(tmp_path: Path) -> None:
    fs = fs_from_inspect(inspect_doc(tmp_path))
    write(tmp_path / "volumes" / "yolo-runs" / "_data" / "detect" / "train" / "results.csv", b"volume\n")
    write(tmp_path / "project" / "runs" / "detect" / "train" / "results.csv", b"hidden under the volume\n")
    where = to_host("/workspace/runs/detect/train", fs)
    assert where is not None and where.mount.kind == "volume"
    assert read_file(where, "results.csv", max_b=1000) == b"volume\n"


def test_a_relative_path_is_the_working_directorys(tmp_path: Path) -> None:
    fs = fs_from_inspect(inspect_doc(tmp_path))
    write(tmp_path / "volumes" / "yolo-runs" / "_data" / "detect" / "train2" / "results.csv", b"rel\n")
    where = to_host("runs/detect/train2", fs)
    assert where is not None and read_file(where, "results.csv", max_b=100) == b"rel\n"


def test_a_path_on_no_mount_or_on_a_tmpfs_is_not_mapped(tmp_path: Path) -> None:
    fs = fs_from_inspect(inspect_doc(tmp_path))
    assert to_host("/root/runs/detect/train", fs) is None  # the container's own layer: console fallback
    assert to_host("/scratch/runs", fs) is None
    assert to_host("/workspacex/runs", fs) is None  # a prefix of a name is not a parent directory


def test_dotdot_is_refused_even_when_it_would_stay_inside(tmp_path: Path) -> None:
    fs = fs_from_inspect(inspect_doc(tmp_path))
    write(tmp_path / "secret")
    assert to_host("/workspace/../etc/shadow", fs) is None
    assert to_host("/workspace/runs/../out", fs) is None


def test_a_symlink_planted_in_the_run_directory_is_not_followed(tmp_path: Path) -> None:
    fs = fs_from_inspect(inspect_doc(tmp_path))
    outside = write(tmp_path / "host-secret.txt", b"root's secret\n")
    run = tmp_path / "project" / "out" / "train"
    run.mkdir(parents=True)
    (run / "results.csv").symlink_to(outside)  # the container can write this link
    (tmp_path / "project" / "linked").symlink_to(tmp_path)  # and a directory link on the way
    write(tmp_path / "project" / "real" / "results.csv")
    assert read_file(to_host("/workspace/out/train", fs), "results.csv", max_b=1000) is None  # type: ignore[arg-type]
    assert read_file(to_host("/workspace/linked/project/real", fs), "results.csv", max_b=1000) is None  # type: ignore[arg-type]
    assert read_file(to_host("/workspace/real", fs), "results.csv", max_b=1000) is not None  # type: ignore[arg-type]


def test_only_regular_files_within_the_limit_are_read(tmp_path: Path) -> None:
    fs = ContainerFs((Mount(str(tmp_path), "/w"),))
    write(tmp_path / "big.csv", b"x" * 2000)
    os.mkfifo(tmp_path / "fifo.csv")  # would block a reader forever
    (tmp_path / "dir.csv").mkdir()
    where = to_host("/w", fs)
    assert where is not None
    assert read_file(where, "big.csv", max_b=1999) is None and read_file(where, "big.csv", max_b=2000) == b"x" * 2000
    assert read_file(where, "fifo.csv", max_b=100) is None and read_file(where, "dir.csv", max_b=100) is None
    assert read_file(where, "../big.csv", max_b=9999) is None
