"""``cotrain project export`` of an image-classification project: the network as its library
builds it, loadable without Cotrain -- transformers' architectures by ``from_pretrained``
(with an image processor that prepares pictures as the peers did), torchvision's by
``torchvision.models.get_model`` and ``model.safetensors`` (``torchvision.json`` names the
call).

A collaboration's batch norm layers normalize by each batch's own statistics and keep no
running ones (tasks/images.py ``batch_statistics``), but a library's network evaluates with
running statistics: they are measured, as SWA's ``update_bn`` does, by the averages over
``RECALIBRATION`` micro-batches of the project's own training shards through the trained
network."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.tasks.images import BATCH_NORM_STATS, TORCHVISION, ImageClassification

RECALIBRATION = 64  # micro-batches whose statistics the running ones average
TORCHVISION_FILE = "torchvision.json"


def export_image_model(task: ImageClassification, weights: dict[str, torch.Tensor], out: Path,
                       seed: int) -> None:
    model: Any = task.plain_model()  # (transformers' PreTrainedModel, but for torchvision's)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    stray = [k for k in missing if not k.endswith(BATCH_NORM_STATS)] + list(unexpected)
    if stray:
        raise ValueError(f"the state does not hold this project's network ({', '.join(stray[:3])} differ)")
    recalibrate(model, task, seed)
    p = task.params
    if task.cfg is not None:
        from transformers import ViTImageProcessor

        model.save_pretrained(str(out), safe_serialization=True)
        mean, std = task.channel_values(p.mean, 0.0), task.channel_values(p.std, 1.0)
        ViTImageProcessor(size={"height": p.image_size, "width": p.image_size}, image_mean=mean,
                          image_std=std).save_pretrained(str(out))
        return
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    call = {"name": p.architecture.removeprefix(TORCHVISION), "num_classes": p.num_classes, **p.config}
    (out / TORCHVISION_FILE).write_text(json.dumps({
        "get_model": call, "image_size": p.image_size, "channels": p.channels,
        "mean": task.channel_values(p.mean, 0.0), "std": task.channel_values(p.std, 1.0)}, indent=2) + "\n")


def recalibrate(model: nn.Module, task: ImageClassification, seed: int) -> None:
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not layers:
        return
    momenta = [m.momentum for m in layers]
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # (a cumulative average)
    model.train()
    with torch.no_grad():
        for index in range(RECALIBRATION):
            task.logits(model, task.batch(seed, index))
    for layer, momentum in zip(layers, momenta, strict=True):
        layer.momentum = momentum
    model.eval()
