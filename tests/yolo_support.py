"""Helpers for the real-Ultralytics tests: an offline YOLO environment and tiny synthetic datasets.

Everything is generated here (no download): images of coloured shapes on noise with labels in the
format each task expects. Small enough that 2 epochs at imgsz=64 take seconds on a CPU.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

CLASSES = ("square", "disc")


def font_file() -> Path:
    """Any TTF on the machine; matplotlib (an Ultralytics dependency) ships DejaVuSans."""
    import matplotlib

    path = Path(matplotlib.__file__).parent / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    if not path.exists():
        raise RuntimeError(f"no TTF font found at {path}")
    return path


def yolo_env(config_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """An environment in which Ultralytics never touches the network or the user's settings."""
    env = dict(os.environ if base is None else base)
    env.update(
        YOLO_CONFIG_DIR=str(config_dir),
        YOLO_OFFLINE="1",
        YOLO_AUTOINSTALL="false",
        YOLO_VERBOSE="true",
        MPLBACKEND="Agg",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def prepare_config_dir(config_dir: Path) -> Path:
    """A private YOLO_CONFIG_DIR: the font Ultralytics would download, analytics and loggers off."""
    target = config_dir / "Ultralytics"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(font_file(), target / "Arial.ttf")
    shutil.copy(font_file(), target / "Arial.Unicode.ttf")
    env = yolo_env(config_dir)
    settings = [
        "sync=False",
        "mlflow=False",
        "clearml=False",
        "comet=False",
        "dvc=False",
        "raytune=False",
        "tensorboard=False",
        "wandb=False",
    ]
    yolo = shutil.which("yolo") or str(Path(sys.executable).parent / "yolo")
    subprocess.run([yolo, "settings", *settings], env=env, check=True, capture_output=True, timeout=120)
    return config_dir


def _shape(rng: random.Random, size: int) -> tuple[int, float, float, float, float]:
    cls = rng.randrange(len(CLASSES))
    w = rng.uniform(0.25, 0.5)
    h = w if cls == 1 else rng.uniform(0.25, 0.5)
    cx = rng.uniform(w / 2 + 0.02, 1 - w / 2 - 0.02)
    cy = rng.uniform(h / 2 + 0.02, 1 - h / 2 - 0.02)
    return cls, cx, cy, w, h


def _draw(rng: random.Random, size: int, shapes: list[tuple[int, float, float, float, float]]):
    import numpy as np
    from PIL import Image, ImageDraw

    noise = np.random.default_rng(rng.randrange(2**32)).integers(0, 80, (size, size, 3), dtype=np.uint8)
    img = Image.fromarray(noise)
    draw = ImageDraw.Draw(img)
    for cls, cx, cy, w, h in shapes:
        box = [(cx - w / 2) * size, (cy - h / 2) * size, (cx + w / 2) * size, (cy + h / 2) * size]
        colour = (230, 60, 60) if cls == 0 else (60, 200, 230)
        (draw.rectangle if cls == 0 else draw.ellipse)(box, fill=colour)
    return img


def _label_line(task: str, shape: tuple[int, float, float, float, float]) -> str:
    cls, cx, cy, w, h = shape
    x0, y0, x1, y1 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2
    if task == "segment":
        return f"{cls} {x0:.4f} {y0:.4f} {x1:.4f} {y0:.4f} {x1:.4f} {y1:.4f} {x0:.4f} {y1:.4f}"
    if task == "obb":
        return f"{cls} {x0:.4f} {y0:.4f} {x1:.4f} {y0:.4f} {x1:.4f} {y1:.4f} {x0:.4f} {y1:.4f}"
    if task == "pose":  # two keypoints: top-left and bottom-right corners, visible
        return f"{cls} {cx:.4f} {cy:.4f} {w:.4f} {h:.4f} {x0:.4f} {y0:.4f} 2 {x1:.4f} {y1:.4f} 2"
    return f"{cls} {cx:.4f} {cy:.4f} {w:.4f} {h:.4f}"


def make_dataset(
    root: Path, task: str = "detect", n_train: int = 8, n_val: int = 4, size: int = 64, seed: int = 0
) -> Path:
    """Write a dataset for ``task``; returns the data argument (a data.yaml, or the folder for classify)."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", n_train), ("val", n_val)):
        for i in range(count):
            shapes = [_shape(rng, size) for _ in range(rng.randint(1, 2))]
            if task == "classify":
                shapes = shapes[:1]
                folder = root / split / CLASSES[shapes[0][0]]
                folder.mkdir(parents=True, exist_ok=True)
                _draw(rng, size, shapes).save(folder / f"{i:03d}.jpg")
                continue
            (root / "images" / split).mkdir(parents=True, exist_ok=True)
            (root / "labels" / split).mkdir(parents=True, exist_ok=True)
            _draw(rng, size, shapes).save(root / "images" / split / f"{i:03d}.jpg")
            lines = [_label_line(task, s) for s in shapes]
            (root / "labels" / split / f"{i:03d}.txt").write_text("\n".join(lines) + "\n")
    if task == "classify":
        for split in ("train", "val"):  # every class needs a folder in every split
            for name in CLASSES:
                folder = root / split / name
                if not any(folder.glob("*.jpg")) if folder.exists() else True:
                    folder.mkdir(parents=True, exist_ok=True)
                    _draw(rng, size, [(CLASSES.index(name), 0.5, 0.5, 0.4, 0.4)]).save(folder / "extra.jpg")
        return root
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(CLASSES))
    extra = "kpt_shape: [2, 3]\nflip_idx: [0, 1]\n" if task == "pose" else ""
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images/train\nval: images/val\n{extra}names:\n{names}\n")
    return data
