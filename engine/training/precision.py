"""Mixed precision: the forward and backward passes in bfloat16 or float16 where the project
asks for it. Parameters, gradients, the averaged gradient and the step stay fp32, so every
peer still applies the same bits."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import torch

from engine.project import Precision

log = logging.getLogger(__name__)

# Dynamic loss scaling as in mixed-precision training (Micikevicius et al., 2018) and
# torch.amp.GradScaler: start high, halve on an overflow, double after this many clean
# micro-batches.
INITIAL_SCALE = 2.0**16
GROWTH_INTERVAL = 2000
MIN_SCALE = 1.0
MAX_SCALE = 2.0**24


def autocast(precision: Precision, device: torch.device | None) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device.type if device is not None else "cpu", dtype=dtype)


class LossScaler:
    """float16 ends at 65504 and loses normal numbers below 6e-5: the backward pass of a
    small loss underflows to zeros unless the loss is scaled up first, and too large a
    scale overflows. Each micro-batch's gradient is unscaled before it joins the
    accumulator, so what a peer brings to a round -- and so every peer's step -- is the
    fp32 gradient sum, whatever scale each peer has reached. A micro-batch that overflowed
    adds nothing and counts no samples."""

    def __init__(self, scale: float = INITIAL_SCALE, growth_interval: int = GROWTH_INTERVAL) -> None:
        self.scale = scale
        self.growth_interval = growth_interval
        self.skipped = 0
        self._clean = 0

    def backward(self, loss: torch.Tensor, params: Sequence[torch.nn.Parameter]) -> bool:
        """Back-propagate ``loss`` into ``params``' ``.grad``; False (nothing added) if the
        scaled gradient overflowed."""
        grads = torch.autograd.grad(loss * self.scale, list(params), allow_unused=True)
        present = [g for g in grads if g is not None]
        if present and not bool(torch.stack([torch.isfinite(g).all() for g in present]).all()):
            self.skipped += 1
            self._clean = 0
            self.scale = max(self.scale / 2, MIN_SCALE)
            log.info("fp16 gradient overflowed: micro-batch dropped, loss scale now %g", self.scale)
            return False
        inverse = 1.0 / self.scale
        for p, g in zip(params, grads, strict=True):
            if g is None:
                continue
            g = g.to(p.dtype).mul_(inverse)
            p.grad = g if p.grad is None else p.grad.add_(g)
        self._clean += 1
        if self._clean >= self.growth_interval:
            self._clean = 0
            self.scale = min(self.scale * 2, MAX_SCALE)
        return True
