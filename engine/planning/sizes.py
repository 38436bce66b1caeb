"""How many bytes a part of the vector takes on the wire, per compression.

Torch-free, apart from the codecs themselves (compression.py): the backbone sizes an
auxiliary peer's credit, the bytes it aggregated, with it.
"""

from __future__ import annotations

from engine.project import CompressionMethod

BLOCK = 1024  # values per block; each block carries its own fp32 scale (and offset, in uint8)


def blocks(n: int) -> int:
    return -(-n // BLOCK)


def encoded_size(n: int, method: CompressionMethod) -> int:
    """Bytes that ``n`` values take on the wire."""
    if method == "fp16":
        return 2 * n + 4 * blocks(n)
    if method == "uint8":
        return n + 8 * blocks(n)
    return 4 * n
