"""Mixed precision: the forward and backward passes in bfloat16 where the project asks for
it. Parameters, gradients, the averaged gradient and the step stay fp32, so every peer still
applies the same bits."""

from __future__ import annotations

import contextlib

import torch

from engine.project import Precision


def autocast(precision: Precision, device: torch.device | None) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type if device is not None else "cpu", dtype=torch.bfloat16)
