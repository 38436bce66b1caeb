"""Moving between a model's parameters and one flat vector, and fingerprinting them."""

from __future__ import annotations

import hashlib
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


PROOF_VALUES = 256  # values a state proof covers: a peer without the state guesses none of them


def state_proof(params: Sequence[torch.Tensor], nonce: str) -> str:
    """Proof that we hold these parameters, for a round's ``nonce`` (RoundStart.nonce): the
    hash of the nonce and of PROOF_VALUES values at positions the nonce picks. A state's
    own hash is broadcast with every step, so anyone can repeat it; this, only a peer
    holding the values (the same bits on every peer that holds the state)."""
    seed = bytes.fromhex(nonce)
    total = sum(p.numel() for p in params)
    digest = hashlib.sha256(seed)
    if total == 0:
        return digest.hexdigest()
    stream = hashlib.shake_256(seed).digest(8 * PROOF_VALUES)
    positions = sorted(int.from_bytes(stream[8 * i:8 * i + 8], "little") % total for i in range(PROOF_VALUES))
    # The values in position order, as float32 bytes, in one gather: hashing their bytes
    # one value at a time gave the same digest at 4x the cost.
    flat = torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])
    digest.update(flat[torch.tensor(positions)].numpy().tobytes())
    return digest.hexdigest()
