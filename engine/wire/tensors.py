"""State files: named tensors as one JSON index plus one contiguous byte payload.

Used for training state sent between peers and for checkpoint files. Unlike pickle,
loading a state file runs no code, and every offset and size is checked against the
payload. Nothing here needs torch: the backbone checks checkpoints with this module alone,
and engine/training/state.py turns entries into tensors.
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from engine.wire import ProtocolError
from engine.wire.codec import Codec, encode
from engine.wire.types import EpochNumber, ProjectId, Sha256

FILE_VERSION = 1  # of the file layout; the wire version of messages moves independently
FILE_MAGIC = b"COTRAIN-STATE\0"
_FILE_HEAD = struct.Struct("!14sBI")  # magic, version, index length
MAX_INDEX = 16 * 1024 * 1024
ITEM_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
              "uint8": 1, "bool": 1}
Dtype = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool"]
Dimension = Annotated[int, Meta(ge=0, lt=2**40)]
ByteOffset = Annotated[int, Meta(ge=0, lt=2**48)]
MODEL_PREFIX = "model/"


class TensorEntry(Struct):
    name: Annotated[str, Meta(min_length=1, max_length=512)]
    dtype: Dtype
    shape: Annotated[list[Dimension], Meta(max_length=16)]
    offset: ByteOffset
    nbytes: ByteOffset


Int64 = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]  # what the hash packs it as
NumberName = Annotated[str, Meta(max_length=512)]


class StateMeta(Struct):
    epoch: EpochNumber
    project: ProjectId
    state_sha256: Sha256
    numbers: Annotated[dict[NumberName, Int64 | float], Meta(max_length=100_000)] = \
        field(default_factory=dict)


class StateIndex(Struct):
    tensors: Annotated[list[TensorEntry], Meta(max_length=100_000)]
    meta: StateMeta


_index: Codec[StateIndex] = Codec(StateIndex, "state file index", MAX_INDEX)


@dataclass
class StateFile:
    """A decoded state file: its index, checked against ``payload``."""

    index: StateIndex
    payload: memoryview

    def __post_init__(self) -> None:
        """The entries must tile the payload: each where the last ended, nothing after."""
        end, seen = 0, set()
        for entry in sorted(self.index.tensors, key=lambda e: e.offset):
            if entry.name in seen:
                raise ProtocolError(f"tensor {entry.name} appears twice")
            seen.add(entry.name)
            if entry.nbytes != math.prod(entry.shape) * ITEM_SIZES[entry.dtype]:
                raise ProtocolError(f"tensor {entry.name}: size does not fit its shape")
            if entry.offset != end:
                raise ProtocolError(f"tensor {entry.name}: bytes out of place in the file")
            end += entry.nbytes
        if end != len(self.payload):
            raise ProtocolError(f"the file holds {len(self.payload) - end} bytes beyond its tensors")

    @property
    def meta(self) -> StateMeta:
        return self.index.meta

    def data(self, entry: TensorEntry) -> memoryview:
        return self.payload[entry.offset : entry.offset + entry.nbytes]

    def state_sha256(self) -> str:
        """The hash of the state this file holds, computed from its bytes alone (no torch)."""
        return state_digest(((e.name, e.dtype, e.shape, self.data(e)) for e in self.index.tensors),
                            self.meta.numbers, self.meta.epoch)


def state_digest(tensors: Iterable[tuple[str, str, Sequence[int], bytes | memoryview]],
                 numbers: Mapping[str, int | float], epoch: int) -> str:
    """The hash of a whole training state: every tensor (name, dtype, shape, bytes) in name
    order, every number, and the epoch, each length-prefixed so no two states share a
    stream. Peers hash what they hold after each step; a joiner, a donor and the backbone
    hash a state file's bytes; equal hashes mean the same model, optimizer and epoch."""
    digest = hashlib.sha256()
    for name, dtype, shape, data in sorted(tensors, key=lambda tensor: tensor[0]):
        head = f"{name}\0{dtype}\0{','.join(map(str, shape))}".encode()
        digest.update(struct.pack("<IQ", len(head), len(data)))
        digest.update(head)
        digest.update(data)
    for name, value in sorted(numbers.items()):
        encoded = name.encode()
        kind, fmt = (b"f", "<d") if isinstance(value, float) else (b"i", "<q")
        digest.update(struct.pack("<I", len(encoded)) + encoded + kind + struct.pack(fmt, value))
    digest.update(b"epoch" + struct.pack("<q", epoch))
    return digest.hexdigest()


def encode_file(index: StateIndex, payload: bytes | bytearray) -> bytes:
    head = encode(index)
    return _FILE_HEAD.pack(FILE_MAGIC, FILE_VERSION, len(head)) + head + bytes(payload)


def decode_file(data: bytes | bytearray | memoryview) -> StateFile:
    view = memoryview(data)
    head_len = _index_length(view[:_FILE_HEAD.size], len(view))
    index = _index.decode(view[_FILE_HEAD.size : _FILE_HEAD.size + head_len])
    return StateFile(index, view[_FILE_HEAD.size + head_len :])


def read_state_meta(path: Path) -> StateMeta:
    """A state file's project, epoch and hash, read without its tensors (a checkpoint can be
    gigabytes; the file's own hash is not checked here)."""
    with open(path, "rb") as file:
        head = file.read(_FILE_HEAD.size)
        head_len = _index_length(memoryview(head), os.fstat(file.fileno()).st_size)
        return _index.decode(file.read(head_len)).meta


def _index_length(head: memoryview, size: int) -> int:
    if len(head) < _FILE_HEAD.size:
        raise ProtocolError("state file is truncated")
    magic, version, head_len = _FILE_HEAD.unpack_from(head)
    if magic != FILE_MAGIC:
        raise ProtocolError("not a Cotrain state file")
    if version != FILE_VERSION:
        raise ProtocolError(f"state file version {version} is not supported (expected {FILE_VERSION})")
    if head_len > MAX_INDEX or _FILE_HEAD.size + head_len > size:
        raise ProtocolError("state file index is out of range")
    return head_len
