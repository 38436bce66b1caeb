"""Which shard and which of its examples a peer's micro-batch (seed, index) holds.

Each peer walks the shards in its own seeded order (a new order each pass over them), taking
``per_visit`` micro-batches from a shard before it moves on, and the shard's examples in a
seeded order too: DeDLOC's volunteers each streamed their own shuffle of the data. Access is
random, so (seed, index) stays the identity of a micro-batch that anyone can draw again, and
a peer needs only the shard it is on (and fetches the next one ahead).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import torch

from engine.project import FileRef
from engine.shards.files import Files


def generator(*keys: object) -> torch.Generator:
    digest = hashlib.sha256(":".join(map(str, keys)).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


@lru_cache(maxsize=64)
def _permutation(size: int, *keys: object) -> torch.Tensor:
    return torch.randperm(size, generator=generator(*keys))


@dataclass(frozen=True)
class Draw:
    shard: int  # position in the manifest's list
    visit: int  # the how-manieth shard this peer is on
    slot: int  # the micro-batch within the visit


def locate(seed: int, index: int, shards: int, per_visit: int) -> Draw:
    visit, slot = divmod(index, per_visit)
    lap, place = divmod(visit, shards)
    return Draw(int(_permutation(shards, "shards", seed, lap)[place]), visit, slot)


def draw_shard(seed: int, index: int, shards: list[FileRef], per_visit: int,
               files: Files) -> tuple[FileRef, Draw]:
    """The shard a micro-batch comes from; on a visit's first micro-batch, the next visit's
    shard starts downloading."""
    draw = locate(seed, index, len(shards), per_visit)
    if draw.slot == 0:
        files.prefetch(shards[locate(seed, index + per_visit, len(shards), per_visit).shard])
    return shards[draw.shard], draw


def examples(seed: int, draw: Draw, count: int, micro_batch: int) -> torch.Tensor:
    """Indices of the micro-batch's examples among the shard's ``count``."""
    order = _permutation(count, "examples", seed, draw.visit)
    return order[(draw.slot * micro_batch + torch.arange(micro_batch)) % count]
