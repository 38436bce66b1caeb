"""Built-in tasks. A project names one and its parameters; no code is ever downloaded."""

from __future__ import annotations

from engine.tasks.base import Batch, Task
from engine.tasks.demo_lm import DemoLM

TASKS: dict[str, type[Task]] = {DemoLM.name: DemoLM}


def create_task(name: str, params: dict, data_dir: str | None = None) -> Task:
    """Build the task ``name``; raises ValueError for unknown tasks or bad parameters."""
    cls = TASKS.get(name)
    if cls is None:
        raise ValueError(f"unknown task {name!r}; this Cotrain knows {', '.join(sorted(TASKS))}")
    return cls.create(params, data_dir)


__all__ = ["TASKS", "Batch", "Task", "create_task"]
