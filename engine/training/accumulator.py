"""The local half of a large batch: gradient sums weighted by samples, until a round takes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from engine.training.params import flat_grad


@dataclass
class Accumulated:
    vector: torch.Tensor
    samples: int = 0
    loss_sum: float = 0.0
    batches: list[int] = field(default_factory=list)
    compute_seconds: float = 0.0
    # The epoch of the state the gradient was computed on (None: more than one, after a
    # failed round's gradient was given back to one computed on a newer state).
    computed_on: int | None = 0


class GradientAccumulator:
    """sum_i(grad_i * n_i) over the epoch's micro-batches, kept in the parameters' ``.grad``.

    Storing sums rather than means makes the collaboration's average exact: the sum over
    peers of sums, divided by the total samples, is the large-batch gradient. PyTorch adds
    each backward pass into ``.grad`` itself, so a micro-batch costs no extra copy; the
    vector is flattened once per round. Every method runs on the compute thread; the
    counters may be read from anywhere.
    """

    def __init__(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.params = list(params)
        self.samples = 0
        self.loss_sum = 0.0
        self.batches: list[int] = []
        self.compute_seconds = 0.0
        self.computed_on: int | None = 0

    def add(self, samples: int, loss_sum: float, batch_id: int, seconds: float = 0.0,
            on_epoch: int = 0) -> None:
        """Record a micro-batch whose summed loss was just back-propagated on the state of
        ``on_epoch``."""
        self._computed(on_epoch)
        self.samples += samples
        self.loss_sum += loss_sum
        self.batches.append(batch_id)
        self.compute_seconds += seconds

    def take(self) -> Accumulated:
        """Hand over everything accumulated and start afresh."""
        taken = Accumulated(flat_grad(self.params), self.samples, self.loss_sum, self.batches,
                            self.compute_seconds, self.computed_on)
        self.clear()
        return taken

    def restore(self, taken: Accumulated) -> None:
        """Put back what a failed round took, keeping what arrived meanwhile."""
        offset = 0
        for p in self.params:
            part = taken.vector[offset : offset + p.numel()].view_as(p).to(p.device)
            p.grad = part.clone() if p.grad is None else p.grad.add_(part)
            offset += p.numel()
        self.restore_counts(taken)

    def restore_counts(self, taken: Accumulated) -> None:
        """Count what ``taken`` brought again, its gradient aside (local mode keeps that
        in its parameters)."""
        if taken.samples:
            self._computed(taken.computed_on)
        self.samples += taken.samples
        self.loss_sum += taken.loss_sum
        self.batches[:0] = taken.batches
        self.compute_seconds += taken.compute_seconds

    def clear(self) -> None:
        for p in self.params:
            p.grad = None
        self.samples, self.loss_sum, self.batches, self.compute_seconds = 0, 0.0, [], 0.0

    def _computed(self, on_epoch: int | None) -> None:
        self.computed_on = on_epoch if self.samples == 0 or self.computed_on == on_epoch else None
