"""A peer's own steps in ``local`` mode (DiLoCo): the inner optimizer on a local copy.

The collaboration's state is the global model and the outer optimizer; they are what rounds
step, hash and hand to joiners. Between outer steps a peer trains a copy of the global
model with the project's optimizer, one inner step per ``inner_batch_size`` samples. A
round takes its pseudo-gradient, global minus local parameters, times the samples behind
it: a *sum*, like a sync round's gradient, so the collaboration's average weighs each peer
by what it computed and the reducers' checks read it as they read gradients. After the
outer step the copy starts again from the new global model; the inner optimizer's state
stays on the peer.

Every method runs on the compute thread, like the rest of the optimizer's torch work.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch

from engine.project import LocalSpec
from engine.training.accumulator import Accumulated, GradientAccumulator
from engine.training.params import copy_weights, flat_params, trainable

InnerOptimizer = Callable[[Sequence[torch.nn.Parameter]], torch.optim.Optimizer]


class LocalSteps:
    def __init__(self, spec: LocalSpec, make_inner: InnerOptimizer,
                 clip_grad_norm: float | None) -> None:
        self.spec = spec
        self.make_inner = make_inner
        self.clip_grad_norm = clip_grad_norm
        self.model: torch.nn.Module | None = None
        self.inner: torch.optim.Optimizer | None = None
        self.params: list[torch.nn.Parameter] = []
        self.steps = 0  # inner steps since the last outer step
        self._pending = 0  # samples whose gradient waits in .grad for the next inner step

    def place(self, master: torch.nn.Module, device: torch.device | None, memo: dict) -> torch.nn.Module:
        """The local copy on ``device`` (None: the CPU), keeping its progress and the inner
        optimizer's state when it moves."""
        source = self.model if self.model is not None else master
        moved = copy.deepcopy(source, memo).to(device or torch.device("cpu"))
        params = trainable(moved)
        inner = self.make_inner(params)
        if self.inner is not None:
            inner.load_state_dict(self.inner.state_dict())  # torch casts its state to the params' device
        self.model, self.inner, self.params = moved, inner, params
        return moved

    def after_micro_batch(self, samples: int, lr: float) -> None:
        """An inner step once ``inner_batch_size`` samples' gradients are in."""
        self._pending += samples
        if self._pending >= self.spec.inner_batch_size:
            self._step(lr)

    def _step(self, lr: float) -> None:
        assert self.inner is not None
        scale = 1.0 / self._pending  # the gradients are sums over the samples
        for p in self.params:
            if p.grad is None:  # as in a sync step: a parameter the batch missed still decays
                p.grad = torch.zeros_like(p)
            else:
                p.grad.mul_(scale)
        if self.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip_grad_norm)
        for group in self.inner.param_groups:
            group["lr"] = lr
        self.inner.step()
        self.inner.zero_grad(set_to_none=True)
        self._pending = 0
        self.steps += 1

    def take(self, master: torch.nn.Module, accumulator: GradientAccumulator, lr: float) -> Accumulated:
        """What this peer brings to the outer step: its pseudo-gradient times its samples.
        Gradients of a partial inner batch take their inner step first: they were computed."""
        if self._pending:
            self._step(lr)
        delta = (flat_params(trainable(master)) - flat_params(self.params)).mul_(accumulator.samples)
        taken = Accumulated(delta, accumulator.samples, accumulator.loss_sum, accumulator.batches,
                            accumulator.compute_seconds)
        accumulator.clear()
        return taken

    def restore(self, master: torch.nn.Module, taken: Accumulated, accumulator: GradientAccumulator) -> None:
        """A step that was undone took ``taken``: the copy goes back to the restored global
        model minus its pseudo-gradient (where it was), with its samples counted again. (A
        round that failed changed no parameters: only its counts come back.)"""
        global_params = trainable(master)
        with torch.no_grad():
            if taken.samples:
                offset = 0
                for mine, theirs in zip(self.params, global_params, strict=True):
                    n = mine.numel()
                    delta = taken.vector[offset:offset + n].view_as(mine) / taken.samples
                    mine.copy_(theirs.detach().to(mine.device) - delta.to(mine.device))
                    offset += n
        accumulator.restore_counts(taken)

    def restart(self, master: torch.nn.Module) -> None:
        """From the global model again (after an outer step, or a download)."""
        assert self.model is not None
        copy_weights(master, self.model)
        for p in self.params:
            p.grad = None
        self._pending, self.steps = 0, 0
