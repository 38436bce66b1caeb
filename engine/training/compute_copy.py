"""Where micro-batches run. The master weights and the optimizer stay on the CPU in fp32,
so every peer takes the step with the same kernels and gets the same bits, whatever its
hardware. On a GPU (and in local mode, wherever they run) micro-batches run on a copy of
the model, whose weights follow the master after every step and whose gradients are
gathered for each round. With overlapped rounds micro-batches always run on a copy: it
keeps the state before the round's step until the next round takes the gradient."""

from __future__ import annotations

import copy

import torch

from engine.governor.throttle import ComputeGate
from engine.training.accumulator import GradientAccumulator
from engine.training.local import LocalSteps
from engine.training.params import copy_weights, trainable


def place(model: torch.nn.Module, device: torch.device | None, gate: ComputeGate, local: LocalSteps | None,
          accumulator: GradientAccumulator, separate: bool = False) -> torch.nn.Module:
    """The model micro-batches run on, on ``device`` (None: the CPU), a copy of ``model``
    where it must be (``separate``: even on the CPU); the gradients accumulated so far move
    with them."""
    old = accumulator.params
    # The memo keeps the gate itself: the copy's pause and duty-cycle hooks call it.
    memo: dict = {id(gate): gate}
    if local is not None:  # micro-batches step a copy, wherever they run
        compute = local.place(model, device, memo)
    elif device is None and not separate:
        compute = model
    else:
        compute = copy.deepcopy(model, memo).to(device or torch.device("cpu"))
    new = trainable(compute)
    for fresh, previous in zip(new, old, strict=True):
        grad = previous.grad
        if fresh is not previous:
            fresh.grad = grad.to(fresh.device) if grad is not None else None
            previous.grad = None
    accumulator.params = new
    return compute


def follow_master(model: torch.nn.Module, compute_model: torch.nn.Module, local: LocalSteps | None) -> None:
    """After the master's state changed: the copy micro-batches run on takes it."""
    if local is not None:
        local.restart(model)
    elif compute_model is not model:
        copy_weights(model, compute_model)
