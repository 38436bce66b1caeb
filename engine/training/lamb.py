"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2):
sahajBERT's optimizer, made for the large batches a collaboration steps with.

Adam's bias-corrected update, plus decoupled weight decay, rescaled per parameter tensor so
that its length is the learning rate times the tensor's own norm (the trust ratio; 1 where
either norm is 0). Written here because no well-kept library offers it on its own: timm's
needs torchvision, torch-optimizer is unmaintained since 2021. One tensor at a time, in a
fixed order, so every peer's step is bit-identical; its slots are Adam's (``step``,
``exp_avg``, ``exp_avg_sq``), so states pack, hash and check as Adam's do."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class Lamb(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01) -> None:
        if lr <= 0 or eps <= 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid LAMB settings: lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]  # (takes no closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=param.dtype)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["step"] += 1
                update = _adam_update(param.grad, state, beta1, beta2, group["eps"])
                if group["weight_decay"]:
                    update.add_(param, alpha=group["weight_decay"])
                param.add_(update, alpha=-group["lr"] * _trust_ratio(param, update))


def _adam_update(grad: torch.Tensor, state: dict, beta1: float, beta2: float, eps: float) -> torch.Tensor:
    exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step = float(state["step"])
    corrected_avg = exp_avg / (1 - beta1 ** step)
    denominator = (exp_avg_sq / (1 - beta2 ** step)).sqrt_().add_(eps)
    return corrected_avg.div_(denominator)


def _trust_ratio(param: torch.Tensor, update: torch.Tensor) -> float:
    weight_norm, update_norm = float(param.norm()), float(update.norm())
    return weight_norm / update_norm if weight_norm > 0 and update_norm > 0 else 1.0
