"""Training state (parameters, optimizer state, epoch) as a state file's tensors.

Hyper-parameters are not transferred: they come from the project, and the learning rate
from the schedule at the epoch. Only tensors and plain numbers travel, so a state from
the network or a checkpoint file can be checked entry by entry and runs no code.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

from engine.training.lamb import Lamb
from engine.wire import ProtocolError
from engine.wire.tensors import MODEL_PREFIX, StateFile, StateIndex, StateMeta, TensorEntry, state_digest

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


def contents(model: torch.nn.Module, optimizer: torch.optim.Optimizer
             ) -> tuple[list[tuple[str, torch.Tensor]], dict[str, int | float]]:
    """What a state holds, named as its file names it: the model's parameters and buffers,
    and the optimizer's per-parameter tensors and numbers."""
    tensors = [(f"{MODEL_PREFIX}{k}", v) for k, v in model.state_dict().items()]
    numbers: dict[str, int | float] = {}
    for index, entry in optimizer.state_dict()["state"].items():
        for key, value in entry.items():
            name = f"{OPTIM_PREFIX}{index}/{key}"
            if isinstance(value, torch.Tensor):
                tensors.append((name, value))
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                numbers[name] = value
    return tensors, numbers


def state_sha256(model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> str:
    """The hash of everything a joiner receives (engine.wire.tensors.state_digest)."""
    tensors, numbers = contents(model, optimizer)
    return state_digest(((name, _NAMES[t.dtype], list(t.shape), _raw(t)) for name, t in tensors),
                        numbers, epoch)


def _raw(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy when it is on the CPU and contiguous already."""
    return tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data


def pack_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
               project_id: str) -> tuple[StateIndex, bytearray]:
    tensors, numbers = contents(model, optimizer)
    meta = StateMeta(epoch, project_id, state_sha256(model, optimizer, epoch), numbers)
    return pack(tensors, meta)


# What each optimizer keeps per parameter: a state may hold these and nothing else, all of
# them for every parameter it holds any for ("step" is a count, the others the parameter's
# shape); anything else would crash the step, or quietly change it.
SLOTS: dict[type, frozenset[str]] = {
    torch.optim.AdamW: frozenset({"step", "exp_avg", "exp_avg_sq"}),
    torch.optim.Adam: frozenset({"step", "exp_avg", "exp_avg_sq"}),
    torch.optim.SGD: frozenset({"momentum_buffer"}),
    Lamb: frozenset({"step", "exp_avg", "exp_avg_sq"}),
}
NON_NEGATIVE = frozenset({"step", "exp_avg_sq"})
# PowerSGD's warm Q of a compressed matrix (engine/averaging/powersgd.py): the next round
# starts from it, so it is state every holder must hold alike. Its shape is (columns,
# rank), only on the matrices the project compresses, and only beside the optimizer's own
# slots -- except SGD's, whose step reads its one slot by name (Adam's, seeing any entry,
# would take its slots as there and crash on the missing ones).
WARM_SLOT = "powersgd_q"
_ALONE_OK = (torch.optim.SGD,)


def check_state(state: StateFile, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                project_id: str, warm: Mapping[int, tuple[int, int]] | None = None,
                ) -> dict[str, tuple[int, str]]:
    """Raise ProtocolError unless ``state`` is a state of this project's model and optimizer:
    every parameter and buffer, each optimizer slot in its shape and type, every value
    finite (second moments and steps not negative). ``warm``: the shape of the warm Q each
    compressed parameter may hold, by index. Returns each optimizer entry's (parameter
    index, slot)."""
    warm = warm or {}
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
    allowed = SLOTS.get(type(optimizer), frozenset())
    slots: dict[str, tuple[int, str]] = {}
    held: dict[int, set[str]] = {}
    for name in [*(k for k in entries if not k.startswith(MODEL_PREFIX)), *meta.numbers]:
        parts = name.split("/")
        if (len(parts) != 3 or f"{parts[0]}/" != OPTIM_PREFIX or not parts[1].isdigit()
                or int(parts[1]) >= len(params)
                or not (parts[2] in allowed or (parts[2] == WARM_SLOT and int(parts[1]) in warm))):
            raise ProtocolError(f"bad optimizer state entry {name}")
        index, key = int(parts[1]), parts[2]
        slots[name] = (index, key)
        held.setdefault(index, set()).add(key)
        found = entries.get(name)
        if found is None:
            value = meta.numbers[name]
            if not math.isfinite(value) or (key in NON_NEGATIVE and value < 0):
                raise ProtocolError(f"optimizer state {name} is not a valid number")
            continue
        shape = () if key == "step" else warm[index] if key == WARM_SLOT else tuple(params[index].shape)
        if tuple(found.shape) != shape or DTYPES[found.dtype] != params[index].dtype:
            raise ProtocolError(f"optimizer state {name} has the wrong shape or type")
    alone_ok = isinstance(optimizer, _ALONE_OK)
    if any(keys - {WARM_SLOT} != allowed and (keys - {WARM_SLOT} or not alone_ok) for keys in held.values()):
        raise ProtocolError("the optimizer state holds some of a parameter's slots but not all")
    for name, tensor in tensors_of(state).items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ProtocolError(f"state tensor {name} holds values that are not finite")
        if slots.get(name, (0, ""))[1] in NON_NEGATIVE and bool((tensor < 0).any()):
            raise ProtocolError(f"state tensor {name} holds negative values")
    return slots


def load_state(state: StateFile, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               project_id: str, warm: Mapping[int, tuple[int, int]] | None = None) -> int:
    """Load ``state`` into ``model`` and ``optimizer``; returns its epoch. Raises ProtocolError
    and leaves both untouched when the state does not fit this project (check_state)."""
    slots = check_state(state, model, optimizer, project_id, warm)
    tensors = tensors_of(state)
    optim_state: dict[int, dict] = {}
    for name, (index, key) in slots.items():
        optim_state.setdefault(index, {})[key] = tensors.get(name, state.meta.numbers.get(name))
    current = optimizer.state_dict()
    weights = {k[len(MODEL_PREFIX):]: v for k, v in tensors.items() if k.startswith(MODEL_PREFIX)}
    model.load_state_dict(weights)
    optimizer.load_state_dict({"state": optim_state, "param_groups": current["param_groups"]})
    return state.meta.epoch



def hold_warm_q(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
                shapes: Mapping[int, tuple[int, int]], next_q: Mapping[int, torch.Tensor]) -> None:
    """(After a step.) The state holds each compressed matrix's new warm Q."""
    for index, q in next_q.items():
        if shapes.get(index) == tuple(q.shape):
            optimizer.state[params[index]][WARM_SLOT] = q


def warm_q(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
           indices: Iterable[int]) -> list[torch.Tensor | None]:
    """The warm Q the state holds for each of these parameters (None: none yet)."""
    return [optimizer.state[params[i]].get(WARM_SLOT) if i < len(params) else None for i in indices]


def warm_slots(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
               shapes: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """The warm slots' shapes (``shapes`` is by index in ``params``) by index in the
    optimizer's parameters, as a state file names them: what check_state allows."""
    order = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    return {order[id(params[i])]: shape for i, shape in shapes.items() if id(params[i]) in order}


def state_budget(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The most bytes a state file of this model and optimizer can take (every slot filled,
    a generous index): no honest frame from a peer is larger, so none is accepted that is."""
    tensors = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    params = [p for group in optimizer.param_groups for p in group["params"]]
    slots = len(SLOTS.get(type(optimizer), ())) + 1  # (a warm Q is smaller than its matrix)
    moments = slots * sum(p.numel() * p.element_size() for p in params)
    entries = len(model.state_dict()) + slots * len(params)
    return tensors + moments + 8 * len(params) + 1024 * entries + (1 << 20)
