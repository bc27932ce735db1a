"""The versions a run records are those importlib.metadata reports (recorder/dist_versions.py).

Compared on every distribution installed in the test environment (hundreds: wheels, the editable
gpuledger, names spelled with '-', '_' and '.'), and for names that are not installed.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from gpuledger.recorder import metadata
from gpuledger.recorder.dist_versions import installed_versions


def test_every_installed_distribution_has_the_version_importlib_metadata_reports() -> None:
    names = sorted({d.metadata["Name"] for d in importlib.metadata.distributions() if d.metadata["Name"]})
    assert len(names) > 50  # the test environment: torch, ultralytics, numpy, sqlalchemy ...
    expected = {n: importlib.metadata.version(n) for n in names}
    assert installed_versions(names) == expected
    # spelled as a user or a requirements file may spell them
    assert installed_versions(["NVIDIA_ML.PY", "SQLAlchemy"]) == {
        "NVIDIA_ML.PY": importlib.metadata.version("nvidia-ml-py"),
        "SQLAlchemy": importlib.metadata.version("sqlalchemy"),
    }


def test_a_package_that_is_not_installed_is_left_out() -> None:
    assert installed_versions(["no-such-package-gpuledger", "torch"]) == {"torch": importlib.metadata.version("torch")}


def test_the_first_on_the_path_wins_and_odd_metadata_is_asked_of_importlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    (first / "demo_pkg-2.0.dist-info").mkdir(parents=True)
    (first / "demo_pkg-2.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 2.0\n")
    (second / "demo_pkg-1.0.dist-info").mkdir(parents=True)
    (second / "demo_pkg-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
    (second / "old_tool.egg-info").mkdir()
    (second / "old_tool.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.0\nName: old-tool\nVersion: 0.3\n")
    monkeypatch.setattr(sys, "path", [str(first), str(second)])
    got = installed_versions(["demo-pkg", "old_tool"])
    assert got == {"demo-pkg": "2.0", "old_tool": "0.3"}
    assert got == {n: importlib.metadata.version(n) for n in got}


def test_a_run_records_the_versions_of_its_packages() -> None:
    found = metadata.versions()
    for name in metadata.VERSION_PACKAGES:
        try:
            assert found[name] == importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            assert name not in found
