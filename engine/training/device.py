"""Where micro-batches run: the CPU, or a CUDA GPU when there is one and the owner allows it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Placement:
    device: torch.device | None  # None: on the CPU, in the model itself
    description: str  # for people: what computes, and why not the GPU when it does not


def choose_device(use_gpu: bool) -> Placement:
    if not torch.cuda.is_available():
        return Placement(None, "the CPU (no CUDA graphics card found)")
    name = torch.cuda.get_device_name(0)
    if not use_gpu:
        return Placement(None, f"the CPU (use of the graphics card, {name}, is turned off)")
    return Placement(torch.device("cuda", 0), f"the graphics card ({name})")
