"""A project's starting weights (``data.initial_weights``: a safetensors file its manifest
lists, hash-checked as every file): the model is built from its configuration, then takes
them, so a collaboration can go on from a pretrained model. safetensors holds tensors and a
JSON header only: reading it runs no code, where a pickle (PyTorch's .bin) would, so no
other format is read."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from engine.tasks.hf_models import ModelError

SHOWN = 5  # names listed in an error


def load_initial_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy the file's tensors into ``model``; ModelError, the model untouched, unless they
    are exactly its tensors in their shapes (a tensor the file leaves out must share its
    storage with one it holds, as ``save_pretrained`` leaves out tied weights)."""
    try:
        weights = load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelError(f"the project's initial weights ({path.name}) are not a safetensors file "
                         f"this Cotrain reads: {exc}") from None
    own = model.state_dict(keep_vars=True)
    unexpected = sorted(set(weights) - set(own))
    misfit = sorted(k for k, v in weights.items() if k in own and (
        v.shape != own[k].shape or v.is_floating_point() != own[k].is_floating_point()))
    held = {own[k].data_ptr() for k in weights if k in own}
    missing = sorted(k for k, v in own.items() if k not in weights and v.data_ptr() not in held)
    for problem, names in (("names no tensor of the model", unexpected),
                           ("has the wrong shape or kind", misfit), ("is missing", missing)):
        if names:
            more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            shown = ", ".join(names[:SHOWN]) + more
            raise ModelError(f"the project's initial weights do not fit its model: {shown} {problem} "
                             f"({len(weights)} tensors in {path.name}, {len(own)} in the model)")
    with torch.no_grad():
        for name, value in weights.items():
            own[name].copy_(value)
