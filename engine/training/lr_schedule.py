"""The optimizer and learning-rate schedule a project declares (engine/project.py), built:
the learning rate is a function of the epoch, so every peer steps with the same one."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from engine.project import LocalSpec, OptimizerSpec, ProjectSpec, ScheduleSpec
from engine.training.lamb import Lamb


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
    groups = decay_groups(spec, list(params))
    if spec.name == "sgd":
        return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    beta1, beta2 = spec.betas
    if spec.name == "lamb":
        return Lamb(groups, lr=spec.lr, betas=(beta1, beta2), eps=spec.eps, weight_decay=spec.weight_decay)
    cls = torch.optim.Adam if spec.name == "adam" else torch.optim.AdamW
    return cls(groups, lr=spec.lr, betas=(beta1, beta2), eps=spec.eps,
               weight_decay=spec.weight_decay, foreach=False)


def decay_groups(spec: OptimizerSpec, params: list[torch.nn.Parameter]) -> list[dict]:
    """One group, or (with ``decay_norms_and_biases`` off) the matrices and, without weight
    decay, the 1-D parameters: every peer splits them alike, so their states match."""
    if not spec.norms_and_biases_apart:
        return [{"params": params}]
    matrices, plain = [p for p in params if p.ndim > 1], [p for p in params if p.ndim <= 1]
    groups: list[dict] = [{"params": matrices}, {"params": plain, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def outer_optimizer(spec: LocalSpec, params: Iterable[torch.nn.Parameter]) -> torch.optim.SGD:
    """Local mode's step, every member's alike, on the global model with the averaged
    pseudo-gradient."""
    nesterov = spec.nesterov and spec.outer_momentum > 0  # torch: Nesterov needs momentum
    return torch.optim.SGD(list(params), lr=spec.outer_lr, momentum=spec.outer_momentum,
                           nesterov=nesterov, foreach=False)


def collaboration_optimizer(project: ProjectSpec, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer whose state the collaboration shares (settles, checkpoints, hands to
    joiners): the project's own in sync mode, the outer one in local mode."""
    params = [p for p in model.parameters() if p.requires_grad]
    if project.mode == "local":
        return outer_optimizer(project.local, params)
    return build_optimizer(project.optimizer, params)
