"""What a built-in task provides: a model, deterministic batches, and a loss."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch


@dataclass
class Batch:
    """A micro-batch; (seed, index) identifies its samples, so anyone can draw it again."""

    seed: int
    index: int
    inputs: torch.Tensor
    targets: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.inputs.shape[0])

    def to(self, device: torch.device | None) -> Batch:
        if device is None:
            return self
        return Batch(self.seed, self.index, self.inputs.to(device), self.targets.to(device))


class Task(ABC):
    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def create(cls, params: dict, data_dir: str | None) -> Task: ...

    @abstractmethod
    def build_model(self) -> torch.nn.Module: ...

    @abstractmethod
    def batch(self, seed: int, index: int) -> Batch: ...

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss over the batch's samples."""
