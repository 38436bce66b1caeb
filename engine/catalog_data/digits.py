"""The catalog's image project ``digits``: scikit-learn's bundled handwritten digits (a copy
of UCI's optical recognition set, 1797 images of 8x8 pixels valued 0 to 16), up-sampled to
32x32 grey PNGs. It trains past 90% held-out accuracy within a minute on one CPU core, so a
volunteer sees image classification work end to end without downloading a data set.

The CSV is read straight from the installed package with gzip and numpy: importing
scikit-learn itself would cost seconds and load much that is not needed."""

from __future__ import annotations

import gzip
import importlib.util
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.authoring.image_shards import cut_images
from engine.authoring.manifest import update_manifest, write_project

log = logging.getLogger(__name__)
DIGITS_CSV = ("datasets", "data", "digits.csv.gz")
SOURCE_SIDE, IMAGE_SIZE, LEVELS = 8, 32, 16
SHARD_BYTES = 1 << 20  # four shards of about 1 MB (400 digits)
HELDOUT_EVERY = 5

PROJECT: dict[str, Any] = {
    "id": "digits",
    "title": "Handwritten digits",
    "description": "A small ResNet learning to read handwritten digits (scikit-learn's copy of the UCI "
                   "set, 32x32 grey). Trains in about a minute on a CPU.",
    "task": "image-classification",
    "task_params": {
        "architecture": "resnet",
        "config": {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1],
                   "layer_type": "basic"},
        "num_classes": 10,
        "image_size": IMAGE_SIZE,
        "channels": 1,
        "micro_batch": 16,
        "per_visit": 16,
        "mean": [0.2],
        "std": [0.3],
    },
    # A step every third of the training digits: a round every fifth of a second of one
    # core's compute, not every 28 ms as at 64, which no network round keeps up with.
    "target_batch_size": 512,
    "optimizer": {"name": "adamw", "lr": 0.003, "weight_decay": 0.01, "clip_grad_norm": 1.0},
    "schedule": {"type": "cosine", "warmup_epochs": 5, "total_epochs": 300, "min_ratio": 0.1},
    "aggregation": {"method": "mean"},
    "round_timeout": 60,
    "checkpoint_every": 10,
}


def digits_csv() -> Path:
    """Where the installed scikit-learn keeps its copy of the digits."""
    found = importlib.util.find_spec("sklearn")
    if found is None or not found.submodule_search_locations:
        raise ValueError("the digits project is made from the copy of the digits that ships with "
                         "scikit-learn: pip install scikit-learn")
    path = Path(next(iter(found.submodule_search_locations))).joinpath(*DIGITS_CSV)
    if not path.is_file():
        raise ValueError(f"this scikit-learn has no {'/'.join(DIGITS_CSV)} to make the digits project from")
    return path


def read_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Images uint8 [1797, 8, 8] scaled to 0..255, and their digits [1797]."""
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    pixels = table[:, :-1].reshape(-1, SOURCE_SIDE, SOURCE_SIDE)
    return (pixels * 255 // LEVELS).astype(np.uint8), table[:, -1]


def build_digits(folder: Path) -> None:
    """Write the project's folder: project.json with its manifest, shards/ and heldout/."""
    images, labels = read_digits(digits_csv())
    folder.mkdir(parents=True, exist_ok=True)
    write_project(folder, PROJECT)
    with tempfile.TemporaryDirectory() as scratch:
        classes = Path(scratch)
        for number, (pixels, label) in enumerate(zip(images, labels, strict=True)):
            (classes / str(label)).mkdir(exist_ok=True)
            image = Image.fromarray(pixels).resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC)
            image.save(classes / str(label) / f"{number:04d}.png")
        count, held, names, _ = cut_images(classes, folder, SHARD_BYTES, HELDOUT_EVERY)
    data = update_manifest(folder)
    log.info("digits: %d images of %d classes, %d shards, %d held out", count, len(names),
             len(data["shards"]), held)
