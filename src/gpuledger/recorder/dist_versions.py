"""Installed versions of a few packages, as ``importlib.metadata.version`` finds them, without it.

Every run records the versions of torch, ultralytics, numpy ... (recorder/metadata.py). Importing
``importlib.metadata`` (its email parser, zip and resource machinery) cost more than the look-ups
themselves, a tenth of ``gpuledger run``'s start-up. This does what its path finder does for the
usual installs: walk ``sys.path`` in order, take the first ``NAME-*.dist-info`` or ``.egg-info``
folder whose normalised name matches, and read the ``Version:`` header of its METADATA (or
PKG-INFO). Anything else (a zip or an egg on the path, a folder without readable metadata) is
asked of ``importlib.metadata`` itself. tests/test_dist_versions.py compares the two on every
distribution of the test environment.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence

_SEPARATORS = re.compile(r"[-_.]+")
_INFO = (".dist-info", ".egg-info")


def normalised(name: str) -> str:
    """A distribution name as importlib.metadata's path finder compares it."""
    return _SEPARATORS.sub("_", name).lower()


def installed_versions(names: Sequence[str]) -> dict[str, str]:
    """name -> version, for those of ``names`` that are installed."""
    wanted = {normalised(n): n for n in names}
    found: dict[str, str] = {}
    ask: list[str] = []  # for importlib.metadata: not a case read here
    for entry in sys.path:
        if not wanted:
            break
        folder = entry or "."
        if os.path.isfile(folder) or folder.endswith(".egg"):  # a zip or an egg: its own finder
            ask += wanted.values()
            wanted.clear()
            break
        try:
            children = os.listdir(folder)
        except OSError:
            continue
        for child in children:
            low = child.lower()
            if not low.endswith(_INFO):
                continue
            key = normalised(low.rpartition(".")[0].partition("-")[0])
            if key not in wanted:
                continue
            name = wanted.pop(key)
            version = _version(os.path.join(folder, child))
            if version is None:
                ask.append(name)
            else:
                found[name] = version
    if ask:
        found.update(_from_importlib(ask))
    return {n: found[n] for n in names if n in found}


def _version(info_dir: str) -> str | None:
    """The ``Version:`` header of the folder's METADATA, else its PKG-INFO (as PathDistribution reads)."""
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info_dir, filename), encoding="utf-8") as fh:
                for line in fh:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    key, sep, value = line.partition(":")
                    if sep and key.strip().lower() == "version":
                        return value.strip()
        except (OSError, UnicodeDecodeError):
            continue
        return None  # a metadata file without a version: importlib.metadata decides
    return None


def _from_importlib(names: list[str]) -> dict[str, str]:
    import importlib.metadata

    out = {}
    for name in names:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if version is not None:  # metadata without a version: not one to record
            out[name] = version
    return out
