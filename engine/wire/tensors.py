"""Tensor bundles: named tensors as one JSON index plus one contiguous byte payload.

Used for training state sent between peers and for checkpoint files. Unlike pickle,
loading a bundle runs no code, and every offset and shape is checked against the payload.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.wire import WIRE_VERSION, ProtocolError

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
FILE_MAGIC = b"COTRAIN-STATE\0"
_FILE_HEAD = struct.Struct("!14sBI")  # magic, version, index length
MAX_INDEX = 16 * 1024 * 1024


@dataclass
class Bundle:
    tensors: dict[str, torch.Tensor]
    meta: dict


def pack(tensors: Iterable[tuple[str, torch.Tensor]], meta: dict) -> tuple[dict, bytearray]:
    """Return (index, payload). Tensors are copied once into the payload."""
    items = [(name, t.detach().contiguous().cpu()) for name, t in tensors]
    entries, offset = [], 0
    for name, t in items:
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name} has unsupported dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        entries.append({"name": name, "dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "offset": offset, "nbytes": nbytes})
        offset += nbytes
    payload = bytearray(offset)
    for (_, t), entry in zip(items, entries, strict=True):
        if entry["nbytes"]:
            dst = torch.frombuffer(payload, dtype=torch.uint8, count=entry["nbytes"],
                                   offset=entry["offset"])
            dst.copy_(t.reshape(-1).view(torch.uint8))
    return {"tensors": entries, "meta": meta}, payload


def unpack(index: object, payload: bytes | bytearray | memoryview) -> Bundle:
    """Validate ``index`` against ``payload`` and return tensors that own their memory."""
    if not isinstance(index, dict) or not isinstance(index.get("tensors"), list):
        raise ProtocolError("bundle index must be an object with a 'tensors' list")
    meta = index.get("meta", {})
    if not isinstance(meta, dict):
        raise ProtocolError("bundle meta must be an object")
    size = len(payload)
    out: dict[str, torch.Tensor] = {}
    for entry in index["tensors"]:
        if not isinstance(entry, dict):
            raise ProtocolError("bundle entry must be an object")
        name, dtype_name = entry.get("name"), entry.get("dtype")
        shape, offset, nbytes = entry.get("shape"), entry.get("offset"), entry.get("nbytes")
        if not isinstance(name, str) or name in out:
            raise ProtocolError(f"bad or repeated tensor name {name!r}")
        if dtype_name not in DTYPES:
            raise ProtocolError(f"tensor {name}: unsupported dtype {dtype_name!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape
        ):
            raise ProtocolError(f"tensor {name}: bad shape")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, nbytes)):
            raise ProtocolError(f"tensor {name}: bad offset or size")
        dtype = DTYPES[dtype_name]
        itemsize = torch.empty((), dtype=dtype).element_size()
        if nbytes != math.prod(shape) * itemsize or offset < 0 or offset + nbytes > size:
            raise ProtocolError(f"tensor {name}: size or offset does not fit the payload")
        if nbytes:
            flat = torch.frombuffer(bytearray(memoryview(payload)[offset : offset + nbytes]), dtype=dtype)
        else:
            flat = torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(shape)
    return Bundle(out, meta)


def encode_file(index: dict, payload: bytes | bytearray) -> bytes:
    head = json.dumps(index, separators=(",", ":")).encode()
    return _FILE_HEAD.pack(FILE_MAGIC, WIRE_VERSION, len(head)) + head + bytes(payload)


def decode_file(data: bytes | bytearray | memoryview) -> Bundle:
    view = memoryview(data)
    if len(view) < _FILE_HEAD.size:
        raise ProtocolError("state file is truncated")
    magic, version, head_len = _FILE_HEAD.unpack_from(view)
    if magic != FILE_MAGIC:
        raise ProtocolError("not a Cotrain state file")
    if version != WIRE_VERSION:
        raise ProtocolError(f"state file version {version} is not supported")
    if head_len > MAX_INDEX or _FILE_HEAD.size + head_len > len(view):
        raise ProtocolError("state file index is out of range")
    try:
        index = json.loads(bytes(view[_FILE_HEAD.size : _FILE_HEAD.size + head_len]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"state file index is not JSON: {exc}") from None
    return unpack(index, view[_FILE_HEAD.size + head_len :])
