"""Moving between a model's parameters and one flat vector, and fingerprinting them."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_grad(params: Sequence[torch.nn.Parameter], scale: float = 1.0) -> torch.Tensor:
    """One new fp32 vector on the CPU of all gradients (zeros where a parameter got none),
    times ``scale``; gradients on a GPU are gathered there and copied once."""
    parts = [
        (p.grad.detach().reshape(-1).float() if p.grad is not None
         else torch.zeros(p.numel(), device=p.device))
        for p in params
    ]
    out = torch.cat(parts).cpu() if parts else torch.zeros(0)
    return out.mul_(scale) if scale != 1.0 else out


def set_grads(params: Sequence[torch.nn.Parameter], vector: torch.Tensor) -> None:
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = vector[offset : offset + n].view_as(p).to(p.dtype).clone()
        offset += n
    if offset != vector.numel():
        raise ValueError("vector does not match the parameters")


def copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Make ``target`` (a copy of ``source``, on any device) hold ``source``'s values."""
    mine = target.state_dict()
    with torch.no_grad():
        for name, value in source.state_dict().items():
            mine[name].copy_(value)


def flat_params(params: Sequence[torch.nn.Parameter]) -> torch.Tensor:
    """One new fp32 vector on the CPU of the parameters' values."""
    parts = [p.detach().reshape(-1).float() for p in params]
    return torch.cat(parts).cpu() if parts else torch.zeros(0)
