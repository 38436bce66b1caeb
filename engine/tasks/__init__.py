"""Task families. A project names one and its parameters; no code is ever downloaded."""

from __future__ import annotations

import threading

import torch

from engine.tasks.base import Batch, Task, TaskData
from engine.tasks.demo_lm import DemoLM
from engine.tasks.images import ImageClassification
from engine.tasks.initial_weights import load_initial_weights
from engine.tasks.language_models import CausalLM, MaskedLM

# Held while the process's random stream must not move under its holder: building the
# initial model, a peer's warm-up (another peer may share the process, as in tests).
RANDOM_STREAM = threading.Lock()
TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (DemoLM, MaskedLM, CausalLM, ImageClassification)}


def create_task(name: str, params: dict, data: TaskData | None = None) -> Task:
    """Build the task ``name``; raises ValueError for unknown tasks or bad parameters."""
    cls = TASKS.get(name)
    if cls is None:
        raise ValueError(f"unknown task {name!r}; this Cotrain knows {', '.join(sorted(TASKS))}")
    return cls.create(params, data or TaskData())


def initial_model(task: Task, seed: int) -> torch.nn.Module:
    """The project's starting model: the same bits on every peer, from the project's seed
    and its initial weights, if it names any. Built under a lock: torch's random stream is
    the process's, and another thread drawing from it meanwhile (a second peer in one
    process) would change the bits."""
    with RANDOM_STREAM, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = task.build_model()
    spec, files = task.data.spec, task.data.files
    if spec is not None and spec.initial_weights is not None and files is not None:
        load_initial_weights(model, files.local(spec.initial_weights))
    return model


__all__ = ["RANDOM_STREAM", "TASKS", "Batch", "Task", "TaskData", "create_task", "initial_model"]
