"""What a task family provides: a model, deterministic batches, a loss and held-out metrics."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch

from engine.project import DataSpec
from engine.shards.files import Files


@dataclass
class Batch:
    """A micro-batch; (seed, index) identifies its samples, so anyone can draw it again."""

    seed: int
    index: int
    tensors: dict[str, torch.Tensor]

    @property
    def size(self) -> int:
        return int(next(iter(self.tensors.values())).shape[0])

    def to(self, device: torch.device | None) -> Batch:
        if device is None:
            return self
        return Batch(self.seed, self.index, {k: t.to(device) for k, t in self.tensors.items()})


@dataclass(frozen=True)
class TaskData:
    """Where a task's data comes from: the project's manifest and its files on this
    computer, or (demo-lm) a folder of text."""

    spec: DataSpec | None = None
    files: Files | None = None
    corpus_dir: str | None = None


class Task(ABC):
    name: ClassVar[str]
    data: TaskData = TaskData()  # (the families with a project's files set their own)

    @classmethod
    @abstractmethod
    def create(cls, params: dict, data: TaskData) -> Task: ...

    @abstractmethod
    def build_model(self) -> torch.nn.Module: ...

    @abstractmethod
    def batch(self, seed: int, index: int) -> Batch: ...

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss over the batch's samples."""

    def memory_needed(self) -> int | None:
        """Bytes a peer needs to train the model, if known before building it."""
        return None

    def heldout(self) -> Iterator[Batch]:
        """The held-out set in fixed batches (none by default)."""
        return iter(())

    def metrics(self, model: torch.nn.Module, batch: Batch) -> dict[str, float]:
        """Sums over the batch's samples of what the learning curve shows (loss; accuracy)."""
        return {"loss": float(self.loss(model, batch)) * batch.size}
