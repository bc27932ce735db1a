"""The fingerprint of an evaluated split: proof that two evaluations saw the same images and labels.

The split is found as Ultralytics finds it (ultralytics/data/utils.py ``check_det_dataset`` and
data/base.py ``get_img_files``): data.yaml's ``path`` (relative: to the working directory, else
to the yaml's folder) joined with the split's entry (``val``, ``test`` ...: a folder, a .txt list
of images, or a list of those; an entry starting ``../`` that does not exist is tried without it);
a folder holds every image below it, a list's ``./`` lines are relative to the list. Each image's
label is the same path with its last ``/images/`` replaced by ``/labels/`` and the suffix by
``.txt`` (``img2label_paths``); labels that do not exist (background images) are left out. A
classification dataset (a folder, no yaml) evaluates ``<folder>/<split>``; its labels are the
class folders, part of each image's path.

The fingerprint is the sha256 of the lines ``<relative path>\\t<size>\\t<sha256 of content>\\n``,
one per image and label file, sorted by path, paths relative to the dataset root with ``/``: the
same files give the same fingerprint in another folder or on another machine; any changed, added
or removed image or label file changes it. File hashes are cached (file_hashes.py).
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuledger.integrations.ultralytics.file_hashes import FileHashes

# Ultralytics' IMG_FORMATS (ultralytics/data/utils.py)
IMAGE_SUFFIXES = {"avif", "bmp", "dng", "heic", "heif", "jp2", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp"}
MAX_FILES = 2_000_000  # beyond this the fingerprint is not worth the wait at the end of a run


class SplitError(ValueError):
    """The split cannot be found; the message says what is missing."""


@dataclass
class SplitFiles:
    name: str
    data: str  # the data.yaml (or classification folder) the split comes from
    root: Path  # the dataset root: file names in the fingerprint are relative to it
    images: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)


def _is_image(name: str) -> bool:
    return name.rpartition(".")[-1].lower() in IMAGE_SUFFIXES


def _load_yaml(path: Path) -> dict[str, Any]:
    import yaml  # PyYAML, an Ultralytics dependency

    loaded = yaml.safe_load(path.read_text(encoding="utf-8", errors="replace"))
    if not isinstance(loaded, dict):
        raise SplitError(f"{path} is not a dataset YAML (no mapping)")
    return loaded


def _root(data: dict[str, Any], yaml_path: Path, cwd: Path) -> Path:
    given = data.get("path")
    if not given:
        return yaml_path.parent
    path = Path(str(given)).expanduser()
    if path.is_absolute():
        return path
    for base in (cwd, yaml_path.parent):
        if (base / path).exists():
            return (base / path).resolve()
    return (yaml_path.parent / path).resolve()


def _entry_path(root: Path, entry: str) -> Path:
    path = (root / entry).resolve()
    if not path.exists() and entry.startswith("../"):
        path = (root / entry[3:]).resolve()
    return path


def _images_of(source: Path, cwd: Path) -> list[str]:
    if source.is_dir():
        found = glob.glob(str(Path(glob.escape(str(source))) / "**" / "*.*"), recursive=True)
    elif source.is_file():
        with open(source, encoding="utf-8-sig") as fh:
            lines = fh.read().strip().splitlines()
        parent = str(source.parent) + os.sep
        found = [x.replace("./", parent, 1) if x.startswith("./") else x for x in lines]
        found = [x if os.path.isabs(x) else str(cwd / x) for x in found]
    else:
        raise SplitError(f"{source} does not exist")
    return [os.path.abspath(x) for x in found if _is_image(x)]


def label_path(image: str) -> str:
    sa, sb = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    return sb.join(image.rsplit(sa, 1)).rsplit(".", 1)[0] + ".txt"


def resolve_split(
    data: str | os.PathLike[str], split: str = "val", root: str | os.PathLike[str] | None = None, cwd: str | None = None
) -> SplitFiles:
    """The files of ``split`` of the dataset ``data`` (a data.yaml, or a classification folder).

    ``root``: the dataset root Ultralytics resolved (the callbacks pass it), instead of finding it."""
    here = Path(cwd or os.getcwd())
    path = Path(os.fspath(data)).expanduser()
    if not path.is_absolute():
        path = here / path
    if path.is_dir():  # classification: one folder per split, one sub-folder per class
        folder = path / split
        if not folder.is_dir() and split == "val" and (path / "validation").is_dir():
            folder = path / "validation"
        if not folder.is_dir():
            raise SplitError(f"{folder} does not exist")
        return SplitFiles(split, str(path), path, sorted(_images_of(folder, here)))
    if not path.is_file():
        raise SplitError(f"{path} does not exist")
    spec = _load_yaml(path)
    if split == "val" and not spec.get("val") and spec.get("validation"):
        spec["val"] = spec["validation"]
    entries = spec.get(split)
    if not entries:
        raise SplitError(f"{path} has no '{split}' split")
    base = Path(os.fspath(root)) if root else _root(spec, path, here)
    images: list[str] = []
    for entry in entries if isinstance(entries, list) else [entries]:
        images += _images_of(_entry_path(base, str(entry)), here)
    images = sorted(set(images))
    labels = [lbl for lbl in (label_path(i) for i in images) if os.path.isfile(lbl)]
    return SplitFiles(split, str(path), base, images, labels)


def source_files(folder: str | os.PathLike[str], name: str = "source") -> SplitFiles:
    """The images below ``folder`` (a prediction's source), without labels."""
    root = Path(os.fspath(folder))
    if not root.is_dir():
        raise SplitError(f"{root} is not a folder")
    return SplitFiles(name, "", root, sorted(_images_of(root, root)))


def _relative(path: str, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def fingerprint_files(files: Sequence[str], root: Path, hashes: FileHashes) -> tuple[str, int, int]:
    """(fingerprint, number of files, bytes) of ``files`` named relative to ``root``."""
    lines = []
    total = 0
    hashes.preload(root)
    for file in files:
        size, sha = hashes.digest(file)
        total += size
        lines.append(f"{_relative(file, root)}\t{size}\t{sha}\n")
    digest = hashlib.sha256()
    for line in sorted(lines):
        digest.update(line.encode("utf-8", "surrogateescape"))
    return digest.hexdigest(), len(lines), total


def fingerprint_split(split: SplitFiles, hashes: FileHashes | None = None) -> dict[str, Any]:
    """``meta.evaluation.split``: name, data, path, fingerprint, files, bytes."""
    files = [*split.images, *split.labels]
    if len(files) > MAX_FILES:
        raise SplitError(f"{len(files)} files: more than {MAX_FILES} are not fingerprinted")
    own = hashes is None
    hashes = FileHashes() if hashes is None else hashes
    try:
        fingerprint, count, total = fingerprint_files(files, split.root, hashes)
    finally:
        if own:
            hashes.close()
    return {
        "name": split.name,
        "data": split.data,
        "path": str(split.root),
        "fingerprint": fingerprint,
        "files": count,
        "bytes": total,
    }
