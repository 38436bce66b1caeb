"""What of a project its collaboration's state depends on, and how an edit changed it.

A state is the model's tensors and the optimizer's slots, by name and in the optimizer's
parameter order; an edit that changes the model, the task that builds it or how the
optimizer groups its parameters leaves every stored state unusable. The backbone keeps
these settings beside the collaboration and serves no edit that changes them while a state
exists. Torch-free (the backbone builds no model): the settings are read from the project,
and any task parameter not known to shape only the data counts as the model's."""

from __future__ import annotations

import json
from typing import Any

from engine.project import ProjectSpec

# Task parameters that change the batches and nothing a state holds.
DATA_ONLY_PARAMS = frozenset({"micro_batch", "per_visit", "mask_probability", "whole_word_masking",
                              "augmentations", "mean", "std"})


def state_settings(spec: ProjectSpec) -> dict[str, Any]:
    """(Local mode's state is its outer SGD's, whatever the inner optimizer.)"""
    sync, optimizer = spec.mode == "sync", spec.optimizer
    apart = sync and optimizer.norms_and_biases_apart
    return {
        "task": spec.task,
        "task_params": {k: v for k, v in spec.task_params.items() if k not in DATA_ONLY_PARAMS},
        "mode": spec.mode,
        "optimizer": {"name": optimizer.name if sync else "sgd", "norms_and_biases_apart": apart},
        "powersgd_rank": spec.powersgd.rank if spec.compression == "powersgd" else None,
    }


def settings_text(spec: ProjectSpec) -> str:
    return json.dumps(state_settings(spec), sort_keys=True, separators=(",", ":"))


def changes(before: str, after: str) -> list[str]:
    """Each setting that differs, as ``path: old -> new`` (paths dotted, as in project.json)."""
    old, new = _flat(json.loads(before)), _flat(json.loads(after))
    return [f"{key}: {_shown(old.get(key))} -> {_shown(new.get(key))}"
            for key in sorted(old.keys() | new.keys()) if old.get(key, _MISSING) != new.get(key, _MISSING)]


_MISSING = object()


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        return {k: v for key, inner in value.items() for k, v in _flat(inner, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): value}


def _shown(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value)
