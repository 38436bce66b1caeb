"""The local half of a large batch: gradient sums weighted by samples, until a round takes them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Accumulated:
    vector: torch.Tensor
    samples: int = 0
    loss_sum: float = 0.0
    batches: list[int] = field(default_factory=list)


class GradientAccumulator:
    """Holds sum_i(grad_i * n_i) over the micro-batches of the current epoch.

    Storing sums rather than means makes the collaboration's average exact:
    sum over peers of sums, divided by the total samples, is the large-batch gradient.
    """

    def __init__(self, numel: int) -> None:
        self.numel = numel
        self._current = Accumulated(torch.zeros(numel))

    @property
    def samples(self) -> int:
        return self._current.samples

    @property
    def loss_sum(self) -> float:
        return self._current.loss_sum

    def add(self, grad_sum: torch.Tensor, samples: int, loss_sum: float, batch_id: int) -> None:
        if grad_sum.numel() != self.numel:
            raise ValueError("gradient does not match the model")
        self._current.vector.add_(grad_sum)
        self._current.samples += samples
        self._current.loss_sum += loss_sum
        self._current.batches.append(batch_id)

    def take(self) -> Accumulated:
        """Hand over everything accumulated and start afresh."""
        taken, self._current = self._current, Accumulated(torch.zeros(self.numel))
        return taken

    def restore(self, taken: Accumulated) -> None:
        """Put back what a failed round took, keeping what arrived meanwhile."""
        self._current.vector.add_(taken.vector)
        self._current.samples += taken.samples
        self._current.loss_sum += taken.loss_sum
        self._current.batches[:0] = taken.batches

    def clear(self) -> None:
        self._current = Accumulated(torch.zeros(self.numel))
