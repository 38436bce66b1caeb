"""Training state (parameters, optimizer state, epoch) as a tensor bundle.

Hyper-parameters are not transferred: they come from the project, and the learning rate
from the schedule at the epoch. Only tensors and plain numbers travel, so a state from
the network or a checkpoint file can be checked entry by entry and runs no code.
"""

from __future__ import annotations

import torch

from engine.training.params import params_sha256, tensors_sha256
from engine.wire import ProtocolError
from engine.wire.tensors import Bundle, pack


def pack_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
               project_id: str) -> tuple[dict, bytearray]:
    tensors: list[tuple[str, torch.Tensor]] = [(f"model/{k}", v) for k, v in model.state_dict().items()]
    numbers: dict[str, float] = {}
    for index, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            name = f"optim/{index}/{key}"
            if isinstance(value, torch.Tensor):
                tensors.append((name, value))
            elif isinstance(value, (int, float)):
                numbers[name] = value
    meta = {"epoch": epoch, "project": project_id, "numbers": numbers,
            "params_sha256": params_sha256(model)}
    return pack(tensors, meta)


def load_state(bundle: Bundle, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               project_id: str) -> int:
    """Load ``bundle`` into ``model`` and ``optimizer``; returns its epoch. Raises ProtocolError
    and leaves both untouched when the bundle does not fit this project's model."""
    meta = bundle.meta
    epoch = meta.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ProtocolError("state has no valid epoch")
    if meta.get("project") != project_id:
        raise ProtocolError(f"state belongs to project {meta.get('project')!r}, not {project_id!r}")
    expected = model.state_dict()
    weights = {k[len("model/"):]: v for k, v in bundle.tensors.items() if k.startswith("model/")}
    if set(weights) != set(expected):
        raise ProtocolError("state does not match this project's model")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape or tensor.dtype != expected[name].dtype:
            raise ProtocolError(f"state tensor {name} has the wrong shape or type")
    numbers = meta.get("numbers", {})
    if not isinstance(numbers, dict):
        raise ProtocolError("state numbers must be an object")
    optim_state: dict[int, dict] = {}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for name, value in [*bundle.tensors.items(), *numbers.items()]:
        if not name.startswith("optim/"):
            continue
        parts = name.split("/")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(params):
            raise ProtocolError(f"bad optimizer state entry {name}")
        index, key = int(parts[1]), parts[2]
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != params[index].shape:
            raise ProtocolError(f"optimizer state {name} has the wrong shape")
        if not isinstance(value, (torch.Tensor, int, float)) or isinstance(value, bool):
            raise ProtocolError(f"optimizer state {name} is not a number")
        optim_state.setdefault(index, {})[key] = value
    current = optimizer.state_dict()
    model.load_state_dict(weights)
    optimizer.load_state_dict({"state": optim_state, "param_groups": current["param_groups"]})
    return epoch


def bundle_params_sha256(bundle: Bundle) -> str:
    """The parameter hash of a state bundle, computed without building the model."""
    return tensors_sha256(
        {k[len("model/"):]: v for k, v in bundle.tensors.items() if k.startswith("model/")}
    )
