"""Optimizer and learning-rate schedule as a project declares them; the LR is a function of the epoch."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class OptimizerSpec:
    name: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    momentum: float = 0.0
    clip_grad_norm: float | None = 1.0

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}")
        if not 0 < self.lr < 10 or self.weight_decay < 0 or self.eps <= 0:
            raise ValueError("optimizer hyper-parameters out of range")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError("betas must be two numbers in [0, 1)")
        if not 0 <= self.momentum < 1:
            raise ValueError("momentum must be in [0, 1)")
        if self.clip_grad_norm is not None and self.clip_grad_norm <= 0:
            raise ValueError("clip_grad_norm must be positive")


@dataclass
class ScheduleSpec:
    """Linear warm-up over ``warmup_epochs``, then constant, linear or cosine decay to
    ``min_ratio`` of the base LR at ``total_epochs``."""

    type: str = "linear"
    warmup_epochs: int = 0
    total_epochs: int = 1000
    min_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.type not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}")
        if self.warmup_epochs < 0 or self.total_epochs < 1 or not 0 <= self.min_ratio <= 1:
            raise ValueError("schedule parameters out of range")


def lr_at(spec: ScheduleSpec, base_lr: float, epoch: int) -> float:
    if epoch < spec.warmup_epochs:
        return base_lr * (epoch + 1) / (spec.warmup_epochs + 1)
    if spec.type == "constant":
        return base_lr
    span = max(spec.total_epochs - spec.warmup_epochs, 1)
    progress = min(max(epoch - spec.warmup_epochs, 0) / span, 1.0)
    if spec.type == "linear":
        factor = 1.0 - progress * (1.0 - spec.min_ratio)
    else:
        factor = spec.min_ratio + (1.0 - spec.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return base_lr * factor


def build_optimizer(spec: OptimizerSpec, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    params = list(params)
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    cls = torch.optim.Adam if spec.name == "adam" else torch.optim.AdamW
    return cls(params, lr=spec.lr, betas=tuple(spec.betas), eps=spec.eps,
               weight_decay=spec.weight_decay, foreach=False)
