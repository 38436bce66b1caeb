"""Training state (parameters, optimizer state, epoch) as a state file's tensors.

Hyper-parameters are not transferred: they come from the project, and the learning rate
from the schedule at the epoch. Only tensors and plain numbers travel, so a state from
the network or a checkpoint file can be checked entry by entry and runs no code.
"""

from __future__ import annotations

import torch

from engine.training.params import params_sha256
from engine.wire import ProtocolError
from engine.wire.tensors import MODEL_PREFIX, StateFile, StateIndex, StateMeta, TensorEntry

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
OPTIM_PREFIX = "optim/"


def pack(tensors: list[tuple[str, torch.Tensor]], meta: StateMeta) -> tuple[StateIndex, bytearray]:
    """The index and the payload of a state file; tensors are copied once into the payload."""
    items = [(name, t.detach().contiguous().cpu()) for name, t in tensors]
    entries, offset = [], 0
    for name, t in items:
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name} has unsupported dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        entries.append(TensorEntry(name, _NAMES[t.dtype], list(t.shape), offset, nbytes))  # type: ignore[arg-type]
        offset += nbytes
    payload = bytearray(offset)
    for (_, t), entry in zip(items, entries, strict=True):
        if entry.nbytes:
            dst = torch.frombuffer(payload, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)
            dst.copy_(t.reshape(-1).view(torch.uint8))
    return StateIndex(entries, meta), payload


def tensors_of(state: StateFile) -> dict[str, torch.Tensor]:
    """Every tensor of a checked state file, each owning its memory."""
    out: dict[str, torch.Tensor] = {}
    for entry in state.index.tensors:
        dtype = DTYPES[entry.dtype]
        if entry.nbytes:
            flat = torch.frombuffer(bytearray(state.data(entry)), dtype=dtype)
        else:
            flat = torch.empty(0, dtype=dtype)
        out[entry.name] = flat.reshape(entry.shape)
    return out


def pack_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
               project_id: str) -> tuple[StateIndex, bytearray]:
    tensors = [(f"{MODEL_PREFIX}{k}", v) for k, v in model.state_dict().items()]
    numbers: dict[str, int | float] = {}
    for index, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            name = f"{OPTIM_PREFIX}{index}/{key}"
            if isinstance(value, torch.Tensor):
                tensors.append((name, value))
            elif isinstance(value, (int, float)):
                numbers[name] = value
    meta = StateMeta(epoch, project_id, params_sha256(model), numbers)
    return pack(tensors, meta)


def load_state(state: StateFile, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               project_id: str) -> int:
    """Load ``state`` into ``model`` and ``optimizer``; returns its epoch. Raises ProtocolError
    and leaves both untouched when the state does not fit this project's model."""
    meta = state.meta
    if meta.project != project_id:
        raise ProtocolError(f"state belongs to project {meta.project!r}, not {project_id!r}")
    expected = model.state_dict()
    entries = {e.name: e for e in state.index.tensors}
    weights = {k[len(MODEL_PREFIX):]: e for k, e in entries.items() if k.startswith(MODEL_PREFIX)}
    if set(weights) != set(expected):
        raise ProtocolError("state does not match this project's model")
    for name, entry in weights.items():
        if tuple(entry.shape) != tuple(expected[name].shape) or DTYPES[entry.dtype] != expected[name].dtype:
            raise ProtocolError(f"state tensor {name} has the wrong shape or type")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    slots: dict[str, tuple[int, str]] = {}
    for name in [*(k for k in entries if not k.startswith(MODEL_PREFIX)), *meta.numbers]:
        parts = name.split("/")
        if len(parts) != 3 or f"{parts[0]}/" != OPTIM_PREFIX or not parts[1].isdigit() \
                or int(parts[1]) >= len(params):
            raise ProtocolError(f"bad optimizer state entry {name}")
        slots[name] = (int(parts[1]), parts[2])
        found = entries.get(name)
        if found is not None and found.shape and tuple(found.shape) != tuple(params[int(parts[1])].shape):
            raise ProtocolError(f"optimizer state {name} has the wrong shape")
    tensors = tensors_of(state)
    optim_state: dict[int, dict] = {}
    for name, (index, key) in slots.items():
        optim_state.setdefault(index, {})[key] = tensors[name] if name in tensors else meta.numbers[name]
    current = optimizer.state_dict()
    model.load_state_dict({k: tensors[MODEL_PREFIX + k] for k in weights})
    optimizer.load_state_dict({"state": optim_state, "param_groups": current["param_groups"]})
    return meta.epoch

