"""What of a project its state depends on: an edit of the batches, the schedule or the
words leaves it; an edit of the model, the task or how the optimizer holds its slots
changes it, and is named as project.json names it."""

import msgspec
import pytest

from engine.project import ProjectSpec
from engine.project_changes import changes, settings_text

BASE = {"id": "p", "title": "P", "task": "hf-causal-lm",
        "task_params": {"model_type": "gpt2", "config": {"n_layer": 4, "n_embd": 64}, "micro_batch": 8}}


def spec(**edits) -> ProjectSpec:
    project = {**BASE, **edits}
    return msgspec.convert(project, ProjectSpec)


@pytest.mark.parametrize("edit", [
    {"description": "new words", "target_batch_size": 512, "checkpoint_every": 3},
    {"optimizer": {"name": "adamw", "lr": 0.5, "betas": [0.8, 0.9]}, "schedule": {"type": "cosine"}},
    {"task_params": {**BASE["task_params"], "micro_batch": 2, "per_visit": 4}},
    {"optimizer": {"weight_decay": 0.0, "decay_norms_and_biases": False}},  # (one group still)
])
def test_edits_a_state_can_take_change_nothing(edit):
    assert changes(settings_text(spec()), settings_text(spec(**edit))) == []


@pytest.mark.parametrize("edit, said", [
    ({"task_params": {**BASE["task_params"], "config": {"n_layer": 6, "n_embd": 64}}},
     ["task_params.config.n_layer: 4 -> 6"]),
    ({"task_params": {**BASE["task_params"], "seq_len": 256}}, ["task_params.seq_len: (unset) -> 256"]),
    ({"optimizer": {"name": "sgd"}}, ['optimizer.name: "adamw" -> "sgd"']),
    ({"optimizer": {"decay_norms_and_biases": False}}, ["optimizer.norms_and_biases_apart: false -> true"]),
    ({"mode": "local"}, ['mode: "sync" -> "local"', 'optimizer.name: "adamw" -> "sgd"']),  # (the outer one)
    ({"compression": "powersgd"}, ["powersgd_rank: (unset) -> 4"]),
])
def test_edits_of_what_a_state_holds_are_named(edit, said):
    assert changes(settings_text(spec()), settings_text(spec(**edit))) == said
