"""Cutting an image folder (one subfolder per class) into WebDataset shards: tars of
``KEY.png``/``KEY.jpg`` and ``KEY.cls`` pairs that engine/tasks/image_shards.py reads.

The images are shuffled by a hash of their path (shards that each hold one class would give
whole micro-batches of it) and every n-th goes to the held-out set. The tars carry no
times or owners, so the same folder always gives the same files and hashes."""

from __future__ import annotations

import hashlib
import io
import logging
import tarfile
from pathlib import Path

from PIL import Image

from engine.authoring.heldout import every, spread
from engine.authoring.manifest import HELDOUT, SHARDS
from engine.shards.webdataset import IMAGE_SUFFIXES, MAX_MEMBER_BYTES, MAX_SIDE

log = logging.getLogger(__name__)
BLOCK = tarfile.BLOCKSIZE


def class_images(folder: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Class names (sorted; a class's index is its place) and every (image, class) pair."""
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder of class folders")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(names) < 2:
        raise ValueError(f"{folder} has {len(names)} class folders; a classifier needs at least 2 "
                         "(one folder of images per class)")
    pairs, skipped = [], 0
    for label, name in enumerate(names):
        for path in sorted((folder / name).rglob("*")):
            if not path.is_file():
                continue
            if path.suffix.lower().lstrip(".") in IMAGE_SUFFIXES:
                pairs.append((path, label))
            else:
                skipped += 1
    if skipped:
        log.info("left out %d files that are not .png or .jpg images", skipped)
    return names, pairs


def _checked(path: Path) -> tuple[bytes, str, int]:
    """The image's bytes, its member suffix and shorter side, once Pillow agrees it is what
    its name says."""
    data = path.read_bytes()
    if len(data) > MAX_MEMBER_BYTES:
        raise ValueError(f"{path} has {len(data)} bytes; a shard member has at most {MAX_MEMBER_BYTES}")
    suffix = path.suffix.lower().lstrip(".")
    try:
        with Image.open(io.BytesIO(data), formats=[IMAGE_SUFFIXES[suffix]]) as image:
            width, height = image.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{path} is not a {IMAGE_SUFFIXES[suffix]} image: {exc}") from None
    if width > MAX_SIDE or height > MAX_SIDE:
        raise ValueError(f"{path} is {width}x{height} pixels; peers read at most {MAX_SIDE}x{MAX_SIDE}")
    return data, "png" if suffix == "png" else "jpg", min(width, height)


def cut_images(folder: Path, root: Path, shard_bytes: int, heldout_every: int,
               heldout_size: int | None = None) -> tuple[int, int, list[str], int]:
    """Write ``root/shards`` and ``root/heldout`` (every ``heldout_every``-th image held out,
    or ``heldout_size`` images); returns (images, held out, class names, the images' median
    shorter side in pixels)."""
    names, pairs = class_images(folder)
    if not pairs:
        raise ValueError(f"{folder}'s class folders hold no .png or .jpg images")
    pairs.sort(key=lambda pair: hashlib.sha256(pair[0].relative_to(folder).as_posix().encode()).digest())
    keyed = [(f"{number:08d}", path, label) for number, (path, label) in enumerate(pairs, 1)]
    chosen = every(heldout_every) if heldout_size is None else spread(len(keyed), heldout_size, "images")
    held = [entry for number, entry in enumerate(keyed, 1) if chosen(number)]
    if len(held) == len(keyed):
        raise ValueError("every image would go to the held-out set")
    kept = [entry for number, entry in enumerate(keyed, 1) if not chosen(number)]
    sides: list[int] = []
    _write_tars(root / SHARDS, "shard", kept, shard_bytes, sides)
    _write_tars(root / HELDOUT, "heldout", held, shard_bytes, sides)
    return len(pairs), len(held), names, sorted(sides)[len(sides) // 2]


def _member_bytes(size: int) -> int:
    return BLOCK + -(-size // BLOCK) * BLOCK


def _write_tars(folder: Path, stem: str, entries: list[tuple[str, Path, int]], shard_bytes: int,
                sides: list[int]) -> None:
    """Numbered tars of about ``shard_bytes``, each member with a fixed time, owner and mode;
    each image's shorter side goes to ``sides``."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if old.is_file():
            old.unlink()
    groups: list[list[tuple[str, Path, int]]] = []
    size = 0
    for entry in entries:
        grows = _member_bytes(entry[1].stat().st_size) + _member_bytes(len(str(entry[2])))
        if not groups or (size and size + grows > shard_bytes):
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += grows
    for number, group in enumerate(groups):
        with tarfile.open(folder / f"{stem}-{number:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, path, label in group:
                data, suffix, side = _checked(path)
                sides.append(side)
                for name, body in ((f"{key}.{suffix}", data), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = len(body), 0, 0o644
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, io.BytesIO(body))
