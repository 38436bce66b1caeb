"""Image shards as training examples, in the WebDataset layout: an uncompressed tar of
``KEY.png`` (or ``.jpg``) and ``KEY.cls`` pairs, the class index as text. A shard is
untrusted input: it is read from memory, never extracted, its members and images are
bounded in number and size, and only the PNG and JPEG decoders of Pillow ever see it. The
examples depend on the shard alone, so every peer that reads it gets the same ones."""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from engine.shards.jsonl import ShardError
from engine.shards.webdataset import (
    IMAGE_SUFFIXES,
    LABEL_SUFFIX,
    MAX_LABEL_BYTES,
    MAX_MEMBER_BYTES,
    MAX_MEMBERS,
    MAX_SIDE,
    split_name,
)

MAX_DECODED_BYTES = 4 * 2**30  # a shard's images at the project's size, as uint8
# Pillow refuses larger images as decompression bombs (above twice this it raises).
Image.MAX_IMAGE_PIXELS = MAX_SIDE * MAX_SIDE


@dataclass
class ImageExamples:
    """``images`` uint8 [examples, channels, size, size] and ``labels`` long [examples]."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def take(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[rows], self.labels[rows]


def decode_image(data: bytes, suffix: str, image_size: int, channels: int, where: str) -> torch.Tensor:
    """uint8 [channels, image_size, image_size]; a different shape is resized (not cropped)."""
    try:
        with Image.open(io.BytesIO(data), formats=[IMAGE_SUFFIXES[suffix]]) as image:
            width, height = image.size
            if width > MAX_SIDE or height > MAX_SIDE:
                raise ShardError(f"{where} is {width}x{height} pixels; at most {MAX_SIDE}x{MAX_SIDE}")
            image = image.convert("L" if channels == 1 else "RGB")
            if image.size != (image_size, image_size):
                image = image.resize((image_size, image_size), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, dtype=np.uint8)
    except ShardError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, struct.error, zlib.error,
            Image.DecompressionBombError) as exc:  # what Pillow's decoders raise on bad data
        raise ShardError(f"{where} is not a {IMAGE_SUFFIXES[suffix]} image Cotrain can read: {exc}") from None
    tensor = torch.from_numpy(pixels.copy())
    return tensor.unsqueeze(0) if channels == 1 else tensor.permute(2, 0, 1).contiguous()


def decode_label(data: bytes, num_classes: int, where: str) -> int:
    if len(data) > MAX_LABEL_BYTES:
        raise ShardError(f"{where} has {len(data)} bytes; a class index is a short number")
    try:
        label = int(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise ShardError(f"{where} is not a class index (a whole number as text)") from None
    if not 0 <= label < num_classes:
        raise ShardError(f"{where} says class {label}; the project has classes 0 to {num_classes - 1}")
    return label


def count_images(path: Path) -> int:
    """The images a shard holds, by its headers alone (for the manifest)."""
    try:
        with tarfile.open(path, "r:") as tar:
            return sum(1 for m in tar if m.isfile() and split_name(m.name)[1] in IMAGE_SUFFIXES)
    except tarfile.TarError as exc:
        raise ShardError(f"{path.name} is not an uncompressed tar: {exc}") from None


def read_image_shard(path: Path, num_classes: int, image_size: int, channels: int,
                     declared: int | None = None) -> ImageExamples:
    """A shard's images and labels, in the order their keys first appear in the tar. The
    headers are read first, so the images decode into one tensor of their number: stacked
    from a tensor each, a shard's decoded pixels were in memory twice. A shard holding more
    images than its manifest ``declared`` is refused: peers sized their memory by it."""
    per_image = channels * image_size * image_size
    try:
        with tarfile.open(path, "r:") as tar:
            members, labels = _members(tar, path.name, num_classes)
            if declared is not None and len(members) > declared:
                raise ShardError(f"{path.name} holds {len(members)} images; the project's manifest "
                                 f"says {declared}")
            if len(members) * per_image > MAX_DECODED_BYTES:
                raise ShardError(f"{path.name} holds more than {MAX_DECODED_BYTES // per_image} "
                                 f"images of {image_size}x{image_size}")
            images = torch.empty((len(members), channels, image_size, image_size), dtype=torch.uint8)
            for row, (suffix, member) in enumerate(members.values()):
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file
                images[row] = decode_image(extracted.read(member.size), suffix, image_size, channels,
                                           f"{path.name}: {member.name!r}")
    except tarfile.TarError as exc:
        raise ShardError(f"{path.name} is not an uncompressed tar: {exc}") from None
    unlabelled = next((k for k in members if k not in labels), None)
    if unlabelled is not None:
        raise ShardError(f"{path.name}: the image {unlabelled!r} has no {unlabelled}.cls label")
    orphan = next((k for k in labels if k not in members), None)
    if orphan is not None:
        raise ShardError(f"{path.name}: the label {orphan}.cls has no image ({', '.join(IMAGE_SUFFIXES)})")
    if not members:
        raise ShardError(f"{path.name} holds no images")
    return ImageExamples(images, torch.tensor([labels[k] for k in members]))


def _members(tar: tarfile.TarFile, name: str, num_classes: int
             ) -> tuple[dict[str, tuple[str, tarfile.TarInfo]], dict[str, int]]:
    """The shard's image members by key (suffix, header), and its labels, read."""
    images: dict[str, tuple[str, tarfile.TarInfo]] = {}
    labels: dict[str, int] = {}
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise ShardError(f"{name} has more than {MAX_MEMBERS} members")
        where = f"{name}: {member.name!r}"
        if member.isdir():
            continue
        if not member.isfile():
            raise ShardError(f"{where} is not a regular file (a shard holds only files)")
        key, suffix = split_name(member.name)
        if suffix not in IMAGE_SUFFIXES and suffix != LABEL_SUFFIX:
            continue  # WebDataset's other fields (.json, .txt) are not this task's
        if member.size > MAX_MEMBER_BYTES:
            raise ShardError(f"{where} has {member.size} bytes; at most {MAX_MEMBER_BYTES}")
        if key in (labels if suffix == LABEL_SUFFIX else images):
            raise ShardError(f"{where}: the key {key!r} is in the shard twice")
        if suffix == LABEL_SUFFIX:
            extracted = tar.extractfile(member)
            assert extracted is not None  # a regular file
            labels[key] = decode_label(extracted.read(member.size), num_classes, where)
        else:
            images[key] = (suffix, member)
    return images, labels
