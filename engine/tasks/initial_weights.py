"""A project's starting weights (``data.initial_weights``: a safetensors file its manifest
lists, hash-checked as every file): the model is built from its configuration, then takes
them, so a collaboration can go on from a pretrained model. safetensors holds tensors and a
JSON header only: reading it runs no code, where a pickle (PyTorch's .bin) would, so no
other format is read."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.tasks.hf_models import ModelError
from engine.tasks.images import BATCH_NORM_STATS

SHOWN = 5  # names listed in an error


def load_initial_weights(model: torch.nn.Module, path: Path) -> None:
    """Copy the file's tensors into ``model``; ModelError, before any is copied, unless they
    are exactly its tensors in their shapes (a tensor the file leaves out must share its
    storage with one it holds, as ``save_pretrained`` leaves out tied weights). Names and
    shapes come from the file's header first: a file of the wrong tensors is refused before
    any of them is read into memory, and then they are read one at a time."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as weights:
            own = model.state_dict(keep_vars=True)
            # (an exported network's measured batch norm statistics: a collaboration keeps none)
            shapes = {name: weights.get_slice(name) for name in weights.keys()  # noqa: SIM118 (not a dict)
                      if name in own or not name.endswith(BATCH_NORM_STATS)}
            _check_fit(model, {name: (tuple(s.get_shape()), s.get_dtype().startswith(("F", "BF")))
                               for name, s in shapes.items()}, path)
            with torch.no_grad():
                for name in shapes:
                    own[name].copy_(weights.get_tensor(name))
    except ModelError:
        raise
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelError(f"the project's initial weights ({path.name}) are not a safetensors file "
                         f"this Cotrain reads: {exc}") from None


def _check_fit(model: torch.nn.Module, header: dict[str, tuple[tuple[int, ...], bool]], path: Path) -> None:
    """ModelError unless ``header`` (name: shape, whether floating) names the model's tensors."""
    own = model.state_dict(keep_vars=True)
    unexpected = sorted(set(header) - set(own))
    misfit = sorted(k for k, (shape, floating) in header.items() if k in own and (
        shape != tuple(own[k].shape) or floating != own[k].is_floating_point()))
    held = {own[k].data_ptr() for k in header if k in own}
    missing = sorted(k for k, v in own.items() if k not in header and v.data_ptr() not in held)
    for problem, names in (("names no tensor of the model", unexpected),
                           ("has the wrong shape or kind", misfit), ("is missing", missing)):
        if names:
            more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            shown = ", ".join(names[:SHOWN]) + more
            raise ModelError(f"the project's initial weights do not fit its model: {shown} {problem} "
                             f"({len(header)} tensors in {path.name}, {len(own)} in the model)")
