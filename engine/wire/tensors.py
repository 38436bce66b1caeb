"""State files: named tensors as one JSON index plus one contiguous byte payload.

Used for training state sent between peers and for checkpoint files. Unlike pickle,
loading a state file runs no code, and every offset and size is checked against the
payload. Nothing here needs torch: the backbone checks checkpoints with this module alone,
and engine/training/state.py turns entries into tensors.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
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


class StateMeta(Struct):
    epoch: EpochNumber
    project: ProjectId
    params_sha256: Sha256
    numbers: Annotated[dict[Annotated[str, Meta(max_length=512)], int | float], Meta(max_length=100_000)] = \
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
        size, seen = len(self.payload), set()
        for entry in self.index.tensors:
            if entry.name in seen:
                raise ProtocolError(f"tensor {entry.name} appears twice")
            seen.add(entry.name)
            if entry.nbytes != math.prod(entry.shape) * ITEM_SIZES[entry.dtype]:
                raise ProtocolError(f"tensor {entry.name}: size does not fit its shape")
            if entry.offset + entry.nbytes > size:
                raise ProtocolError(f"tensor {entry.name}: bytes beyond the end of the file")

    @property
    def meta(self) -> StateMeta:
        return self.index.meta

    def data(self, entry: TensorEntry) -> memoryview:
        return self.payload[entry.offset : entry.offset + entry.nbytes]

    def params_sha256(self) -> str:
        """The parameter hash of this state, computed without building the model."""
        return named_sha256((e.name[len(MODEL_PREFIX):], self.data(e))
                            for e in self.index.tensors if e.name.startswith(MODEL_PREFIX))


def named_sha256(named: Iterable[tuple[str, bytes | memoryview]]) -> str:
    """Hash of named byte strings in name order: equal hashes mean equal bits. Parameters are
    hashed this way on every peer after each step, and from files by the backbone."""
    digest = hashlib.sha256()
    for name, data in sorted(named, key=lambda item: item[0]):
        digest.update(name.encode())
        digest.update(data)
    return digest.hexdigest()


def encode_file(index: StateIndex, payload: bytes | bytearray) -> bytes:
    head = encode(index)
    return _FILE_HEAD.pack(FILE_MAGIC, FILE_VERSION, len(head)) + head + bytes(payload)


def decode_file(data: bytes | bytearray | memoryview) -> StateFile:
    view = memoryview(data)
    if len(view) < _FILE_HEAD.size:
        raise ProtocolError("state file is truncated")
    magic, version, head_len = _FILE_HEAD.unpack_from(view)
    if magic != FILE_MAGIC:
        raise ProtocolError("not a Cotrain state file")
    if version != FILE_VERSION:
        raise ProtocolError(f"state file version {version} is not supported (expected {FILE_VERSION})")
    if head_len > MAX_INDEX or _FILE_HEAD.size + head_len > len(view):
        raise ProtocolError("state file index is out of range")
    index = _index.decode(view[_FILE_HEAD.size : _FILE_HEAD.size + head_len])
    return StateFile(index, view[_FILE_HEAD.size + head_len :])
