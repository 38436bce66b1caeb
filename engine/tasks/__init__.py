"""Built-in tasks. A project names one and its parameters; no code is ever downloaded."""

from __future__ import annotations

import torch

from engine.tasks.base import Batch, Task
from engine.tasks.demo_lm import DemoLM

TASKS: dict[str, type[Task]] = {DemoLM.name: DemoLM}


def create_task(name: str, params: dict, data_dir: str | None = None) -> Task:
    """Build the task ``name``; raises ValueError for unknown tasks or bad parameters."""
    cls = TASKS.get(name)
    if cls is None:
        raise ValueError(f"unknown task {name!r}; this Cotrain knows {', '.join(sorted(TASKS))}")
    return cls.create(params, data_dir)


def initial_model(task: Task, seed: int) -> torch.nn.Module:
    """The project's starting model: the same bits on every peer, from the project's seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return task.build_model()


__all__ = ["TASKS", "Batch", "Task", "create_task", "initial_model"]
