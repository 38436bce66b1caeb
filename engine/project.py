"""A project: what a collaboration trains and how (shared by backbone and peers)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.training.schedule import OptimizerSpec, ScheduleSpec
from engine.wire.schema import from_dict

PROJECT_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


@dataclass
class ProjectSpec:
    id: str
    title: str
    task: str
    description: str = ""
    task_params: dict = field(default_factory=dict)
    target_batch_size: int = 128
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = field(default_factory=ScheduleSpec)
    seed: int = 0
    round_timeout: float = 60.0
    checkpoint_every: int = 5
    keep_checkpoints: int = 3
    allow_anonymous: bool = True

    def __post_init__(self) -> None:
        if not PROJECT_ID.match(self.id):
            raise ValueError("project id must be lowercase letters, digits and dashes")
        if not 1 <= self.target_batch_size <= 10**9:
            raise ValueError("target_batch_size out of range")
        if not 1 <= self.round_timeout <= 3600:
            raise ValueError("round_timeout must be between 1 and 3600 seconds")
        if self.checkpoint_every < 1 or not 1 <= self.keep_checkpoints <= 100:
            raise ValueError("checkpoint settings out of range")


def load_catalog(path: str | Path) -> list[ProjectSpec]:
    """Projects from a JSON file ``{"projects": [...]}``; raises ValueError naming the problem."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read catalog {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("projects"), list):
        raise ValueError(f"catalog {path} must be an object with a 'projects' list")
    projects = [from_dict(ProjectSpec, p, "project") for p in data["projects"]]
    ids = [p.id for p in projects]
    if len(set(ids)) != len(ids):
        raise ValueError(f"catalog {path} lists a project id twice")
    return projects
