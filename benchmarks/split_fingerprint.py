"""The split fingerprint of a generated 5,000-image val set: first run (every file read) vs cached.

    python benchmarks/split_fingerprint.py [--images 5000] [--image-kb 32] [--rounds 5]

Writes a detect dataset (``--images`` images of ``--image-kb`` KiB of random bytes, one label file
each) in a temporary folder, then per round, interleaved: the fingerprint with an empty hash cache
(every image and label read and hashed: the first evaluation of a split) and again with the cache
that pass filled (only stat() per file). The files are in the page cache for both, so "first"
is the hashing cost; a split read from a cold disk adds its read time. Prints each pass, and the
min/median/max of the per-round ratio first / cached.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine_line, source_state

from gpuledger.integrations.ultralytics.file_hashes import FileHashes
from gpuledger.integrations.ultralytics.fingerprint import fingerprint_split, resolve_split


def make_split(root: Path, images: int, image_kb: int) -> Path:
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    for i in range(images):
        (root / "images" / "val" / f"{i:06d}.jpg").write_bytes(os.urandom(image_kb * 1024))
        (root / "labels" / "val" / f"{i:06d}.txt").write_text(f"{i % 80} 0.5 0.5 0.25 0.25\n")
    old = time.time() - 3600  # older than the cache's racy window, as a real val set is
    for f in root.rglob("*.*"):
        os.utime(f, (old, old))
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/val\nval: images/val\nnames: {{0: a}}\n")
    return data


def timed(data: Path, cache: Path) -> tuple[float, float, dict, FileHashes]:
    """Wall and CPU seconds (this process: the CPU is steadier than the wall on a loaded machine)."""
    start, cpu = time.perf_counter(), time.process_time()
    with FileHashes(cache) as hashes:
        result = fingerprint_split(resolve_split(data, "val"), hashes)
    return time.perf_counter() - start, time.process_time() - cpu, result, hashes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(machine_line())
    print(source_state())
    with tempfile.TemporaryDirectory() as tmp:
        data = make_split(Path(tmp) / "ds", args.images, args.image_kb)
        figures: dict[str, list[float]] = {k: [] for k in ("first", "cached", "first cpu", "cached cpu", "ratio")}
        for r in range(args.rounds):
            cache = Path(tmp) / f"cache-{r}.sqlite"
            first, first_cpu, a, h1 = timed(data, cache)
            again, again_cpu, b, h2 = timed(data, cache)
            assert a["fingerprint"] == b["fingerprint"] and h2.hits == a["files"] and h2.reads == 0
            for key, value in zip(figures, (first, again, first_cpu, again_cpu, first / again), strict=True):
                figures[key].append(value)
            print(f"round {r + 1}: first {first:.3f} s wall / {first_cpu:.3f} s CPU ({h1.reads} files read), "
                  f"cached {again:.3f} s / {again_cpu:.3f} s ({h2.hits} hits), {a['files']} files, "
                  f"{a['bytes'] / 2**20:.1f} MiB")  # fmt: skip
        for key, values in figures.items():
            unit = "" if key == "ratio" else " s"
            print(f"{key}: min {min(values):.3f}  median {statistics.median(values):.3f}  max {max(values):.3f}{unit}")
        print(machine_line())


if __name__ == "__main__":
    main()
