"""The bytes autograd keeps for backward, counted on the meta device: a forward pass there
allocates and computes nothing, yet every tensor it saves for backward has its true shape.
A formula (so many values per token, layer and hidden unit) put an ALBERT whose
feed-forward is 2,000,000 wide at 661 MB; one real batch of it was killed for memory on a
24 GB machine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

# Backward holds the saved activations and, a layer at a time, their gradients and the
# kernels' scratch, and the C allocator keeps freed blocks of the middling ones: one
# micro-batch's peak RSS over the training state measured 0.9-1.8 times what autograd
# saved (the GPT-2 and ALBERT presets; 20,000-wide feed-forward ALBERTs of 64 to 1,024
# tokens a micro-batch). Too low a figure gets a peer killed for memory; too high refuses a
# computer that could have taken part.
BACKWARD_PEAK = 2.0


def saved_bytes(model: nn.Module, forward: Callable[[nn.Module], Any]) -> int:
    """What ``forward(model)`` (on meta tensors) has autograd keep, weights aside (they are
    counted with the training state). A tensor saved twice counts once."""
    weights = {id(t) for t in model.parameters()}
    kept: dict[int, torch.Tensor] = {}  # (held: an id is not reused while its tensor lives)

    def keep(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in weights:
            kept[id(t)] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        forward(model)
    return sum(t.numel() * t.element_size() for t in kept.values())
