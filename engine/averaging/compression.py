"""Gradient compression for the all-reduce: pure functions, tested without a network.

Both codecs are blockwise, as in DeDLOC's and hivemind's practice: every ``BLOCK`` values
carry their own fp32 scale, so one large element costs precision in its block only.

- ``fp16``: each block divided by its largest magnitude, then half precision (2x fewer bytes;
  dividing first keeps sums of many samples' gradients out of fp16's overflow).
- ``uint8``: each block's minimum and step, and one byte per value (about 4x fewer bytes).

Encoding and decoding are IEEE operations element by element (no sums, no fused
multiply-adds), so every peer decodes the same bytes to the same bits: a reducer applies
its own result decoded from what it sends, and every member's hash agrees.
"""

from __future__ import annotations

import math

import torch

from engine.planning.sizes import BLOCK, encoded_size
from engine.planning.sizes import blocks as _blocks
from engine.project import CompressionMethod as Compression

_LEVELS = 255
_FP16_RELATIVE = 2.0**-11  # half precision's rounding error, relative to the value
_FP16_SUBNORMAL = 2.0**-24  # and its absolute floor, relative to the block's largest magnitude


def _padded(flat: torch.Tensor) -> torch.Tensor:
    """``flat`` as rows of BLOCK, the last one filled with zeros."""
    blocks = _blocks(flat.numel())
    padded = torch.zeros(blocks * BLOCK, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    return padded.view(blocks, BLOCK)


def encode(values: torch.Tensor, method: Compression) -> bytes:
    """``values`` (flat fp32, finite) as ``method`` sends them."""
    values = values.detach().to(torch.float32).contiguous().view(-1)
    n = values.numel()
    if method == "none" or n == 0:
        return values.numpy().tobytes()
    blocks = _padded(values)
    if method == "fp16":
        scale = blocks.abs().amax(dim=1)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        halves = (blocks / safe[:, None]).to(torch.float16).view(-1)[:n]
        return halves.numpy().tobytes() + scale.numpy().tobytes()
    low = blocks.amin(dim=1)
    step = (blocks.amax(dim=1) - low) / _LEVELS
    safe = torch.where(step > 0, step, torch.ones_like(step))
    levels = torch.round((blocks - low[:, None]) / safe[:, None]).clamp_(0, _LEVELS).to(torch.uint8)
    return levels.view(-1)[:n].numpy().tobytes() + low.numpy().tobytes() + step.numpy().tobytes()


def decode(payload: bytes | bytearray | memoryview, n: int, method: Compression) -> torch.Tensor:
    """The fp32 values ``payload`` carries; ValueError if it cannot be ``n`` of them."""
    payload = memoryview(payload).cast("B")
    if len(payload) != encoded_size(n, method):
        raise ValueError(f"{len(payload)} bytes, expected {encoded_size(n, method)} for {n} {method} values")
    if method == "none" or n == 0:
        return torch.frombuffer(bytearray(payload), dtype=torch.float32) if n else torch.empty(0)
    blocks = _blocks(n)
    if method == "fp16":
        halves = _padded(torch.frombuffer(bytearray(payload[: 2 * n]), dtype=torch.float16))
        scale = torch.frombuffer(bytearray(payload[2 * n :]), dtype=torch.float32)
        _check_scales(scale, "scale")
        return (halves.to(torch.float32) * scale[:, None]).view(-1)[:n].contiguous()
    levels = _padded(torch.frombuffer(bytearray(payload[:n]), dtype=torch.uint8))
    low = torch.frombuffer(bytearray(payload[n : n + 4 * blocks]), dtype=torch.float32)
    step = torch.frombuffer(bytearray(payload[n + 4 * blocks :]), dtype=torch.float32)
    _check_scales(step, "step")
    if not torch.isfinite(low).all():
        raise ValueError("a block's minimum is not finite")
    return (levels.to(torch.float32) * step[:, None] + low[:, None]).view(-1)[:n].contiguous()


def _check_scales(scales: torch.Tensor, what: str) -> None:
    if not (torch.isfinite(scales).all() and (scales >= 0).all()):
        raise ValueError(f"a block's {what} is negative or not finite")


def error_bound(values: torch.Tensor, method: Compression) -> float:
    """How far (Euclidean) ``method``'s encoding of ``values`` may land from them: what a
    checker allows a reducer's compressed result on top of rounding."""
    values = values.detach().to(torch.float32).view(-1)
    if method == "none" or values.numel() == 0:
        return 0.0
    blocks = _padded(values).double()
    if method == "fp16":
        scale = blocks.abs().amax(dim=1)
        return float(_FP16_RELATIVE * blocks.norm() + _FP16_SUBNORMAL * math.sqrt(BLOCK) * scale.norm())
    half_step = (blocks.amax(dim=1) - blocks.amin(dim=1)) / _LEVELS / 2
    return float(math.sqrt(BLOCK) * half_step.norm())
