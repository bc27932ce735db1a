"""The split fingerprint: the same images and labels give the same fingerprint, anywhere; one
changed label file changes it; the file-hash cache is used when a file's size and mtime are
unchanged (proved by a content change the cache cannot see, not by timing)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from gpuledger.integrations.ultralytics.file_hashes import FileHashes
from gpuledger.integrations.ultralytics.fingerprint import SplitError, fingerprint_split, resolve_split


def _dataset(root: Path, n: int = 5) -> Path:
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            (root / "images" / split / f"{i:03d}.jpg").write_bytes(f"{split} image {i}".encode() * 10)
            (root / "labels" / split / f"{i:03d}.txt").write_text(f"0 0.5 0.5 0.{i + 1} 0.2\n")
    (root / "images" / "val" / "notes.md").write_text("not an image")  # ignored, as Ultralytics does
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: box\n")
    return data


def _expected(root: Path, split: str) -> str:
    """The documented fingerprint, computed here with hashlib from the files on disk."""
    files = sorted((root / "images" / split).glob("*.jpg")) + sorted((root / "labels" / split).glob("*.txt"))
    lines = []
    for f in files:
        data = f.read_bytes()
        lines.append(f"{f.relative_to(root).as_posix()}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n")
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


def _fp(data: Path, cache: Path, split: str = "val", use_cache: bool = True) -> dict:
    with FileHashes(cache, use_cache=use_cache) as hashes:
        return fingerprint_split(resolve_split(data, split), hashes)


def test_fingerprint_is_the_documented_hash_of_images_and_labels(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "ds")
    fp = _fp(data, tmp_path / "cache.sqlite")
    assert fp["fingerprint"] == _expected(tmp_path / "ds", "val")
    assert fp["files"] == 10  # 5 images + 5 labels, not notes.md
    assert fp["name"] == "val" and fp["data"] == str(data)
    assert fp["bytes"] == sum(f.stat().st_size for f in (tmp_path / "ds").glob("*/val/*.*") if f.suffix != ".md")


def test_same_split_elsewhere_same_fingerprint_changed_label_differs(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "a")
    cache = tmp_path / "cache.sqlite"
    first = _fp(data, cache)["fingerprint"]
    assert _fp(data, cache)["fingerprint"] == first  # again, from the cache
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    (tmp_path / "b" / "data.yaml").write_text((tmp_path / "a" / "data.yaml").read_text().replace("/a", "/b"))
    assert _fp(tmp_path / "b" / "data.yaml", cache)["fingerprint"] == first  # same files, other folder
    assert _fp(data, cache, split="train")["fingerprint"] != first

    (tmp_path / "b" / "labels" / "val" / "002.txt").write_text("1 0.5 0.5 0.3 0.2\n")  # one class changed
    changed = _fp(tmp_path / "b" / "data.yaml", cache)["fingerprint"]
    assert changed != first
    assert changed == _expected(tmp_path / "b", "val")

    (tmp_path / "b" / "labels" / "val" / "002.txt").unlink()  # the image becomes a background image
    removed = _fp(tmp_path / "b" / "data.yaml", cache)
    assert removed["fingerprint"] not in (first, changed) and removed["files"] == 9


def _backdate(root: Path) -> None:
    """Files written a minute ago: older than the cache's 'racy' window."""
    for f in root.rglob("*"):
        if f.is_file():
            st = f.stat()
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns - 60 * 10**9))


def test_cache_hit_when_size_and_mtime_are_unchanged(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    data = _dataset(root)
    _backdate(root)
    cache = tmp_path / "cache.sqlite"
    with FileHashes(cache) as hashes:
        first = fingerprint_split(resolve_split(data), hashes)["fingerprint"]
        assert (hashes.reads, hashes.hits) == (10, 0)
    with FileHashes(cache) as hashes:
        assert fingerprint_split(resolve_split(data), hashes)["fingerprint"] == first
        assert (hashes.reads, hashes.hits) == (0, 10)

    # Same size, mtime put back: only a cache that is really used keeps the old hash.
    label = root / "labels" / "val" / "001.txt"
    st = label.stat()
    label.write_text(label.read_text().replace("0 0.5", "1 0.5"))
    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _fp(data, cache)["fingerprint"] == first
    assert _fp(data, cache, use_cache=False)["fingerprint"] != first

    os.utime(label, ns=(st.st_atime_ns, st.st_mtime_ns - 10**9))  # mtime changed: read again
    with FileHashes(cache) as hashes:
        assert fingerprint_split(resolve_split(data), hashes)["fingerprint"] != first
        assert (hashes.reads, hashes.hits) == (1, 9)


def test_recently_written_files_are_not_cached(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "ds")  # just written: a same-tick rewrite would keep size and mtime
    cache = tmp_path / "cache.sqlite"
    _fp(data, cache)
    with FileHashes(cache) as hashes:
        fingerprint_split(resolve_split(data), hashes)
        assert hashes.hits == 0


def test_txt_list_relative_root_and_classification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ds"
    _dataset(root)
    (root / "val.txt").write_text("./images/val/000.jpg\n./images/val/003.jpg\n")
    (root / "list.yaml").write_text("path: ds\ntrain: images/train\nval: val.txt\nnames: [box]\n")
    monkeypatch.chdir(tmp_path)  # path: relative to the working directory, as Ultralytics resolves it
    files = resolve_split(root / "list.yaml", "val")
    assert [Path(f).name for f in files.images] == ["000.jpg", "003.jpg"]
    assert [Path(f).name for f in files.labels] == ["000.txt", "003.txt"]

    cls = tmp_path / "cls"
    for split, name in (("train", "a"), ("val", "a"), ("val", "b")):
        (cls / split / name).mkdir(parents=True, exist_ok=True)
        (cls / split / name / "x.png").write_bytes(name.encode())
    before = fingerprint_split(resolve_split(cls, "val"), FileHashes(use_cache=False))
    assert before["files"] == 2
    (cls / "val" / "b" / "x.png").rename(cls / "val" / "a" / "y.png")  # relabelled by moving it
    assert (
        fingerprint_split(resolve_split(cls, "val"), FileHashes(use_cache=False))["fingerprint"]
        != (before["fingerprint"])
    )


def test_missing_split_is_a_clear_error(tmp_path: Path) -> None:
    data = _dataset(tmp_path / "ds")
    with pytest.raises(SplitError, match="no 'test' split"):
        resolve_split(data, "test")
    shutil.rmtree(tmp_path / "ds" / "images" / "val")
    with pytest.raises(SplitError, match="does not exist"):
        resolve_split(data, "val")
