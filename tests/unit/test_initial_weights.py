"""A project can start from pretrained weights: `cotrain project weights` puts a safetensors
file (what `project export` wrote, tied weights left out) into its folder and manifest,
every peer's starting model is exactly those weights, and weights that do not fit the
model, or are not safetensors, are refused with the reason before anyone trains."""

import json

import pytest
import torch

from engine.authoring.manifest import INITIAL_WEIGHTS
from engine.cli import main
from engine.project_folders import load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from tests.projects import albert_folder

pytestmark = pytest.mark.slow
SMALL = {"config": {"vocab_size": 8000, "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 1,
                    "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64},
         "seq_len": 32, "micro_batch": 2}


def model_of(folder, seed: int) -> torch.nn.Module:
    spec = load_project_folder(folder.root).spec
    task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(folder.root)))
    return initial_model(task, seed)


def test_every_peer_starts_from_the_weights_the_project_names(tmp_path, capsys):
    folder = albert_folder(tmp_path / "projects", task_params=SMALL)
    pretrained = model_of(folder, seed=7)
    pretrained.save_pretrained(tmp_path / "exported")  # (as `project export` writes them)
    assert main(["project", "weights", str(tmp_path / "exported"), str(folder.root)]) == 0
    listed = json.loads((folder.root / "project.json").read_text())["data"]["initial_weights"]
    size = (folder.root / INITIAL_WEIGHTS).stat().st_size
    assert (listed["path"], listed["bytes"]) == (INITIAL_WEIGHTS, size)
    started = model_of(folder, seed=0)  # (the project's seed: its own draws are replaced)
    expected = pretrained.state_dict()
    assert all(torch.equal(value, expected[name]) for name, value in started.state_dict().items())
    assert main(["project", "check", str(folder.root)]) == 0
    assert "✓ one batch" in capsys.readouterr().out


def test_weights_of_another_model_are_refused_by_the_check_naming_what_differs(tmp_path, capsys):
    wide = {**SMALL, "config": {**SMALL["config"], "hidden_size": 48}}
    wider = albert_folder(tmp_path / "other", task_params=wide)
    model_of(wider, seed=1).save_pretrained(tmp_path / "wider")
    folder = albert_folder(tmp_path / "projects", task_params=SMALL)
    assert main(["project", "weights", str(tmp_path / "wider"), str(folder.root)]) == 0
    assert main(["project", "check", str(folder.root)]) == 1
    said = capsys.readouterr().out
    assert "✗ the project's initial weights do not fit its model:" in said, said
    assert "has the wrong shape or kind" in said, said


def test_a_pickle_is_not_taken_as_weights(tmp_path, capsys):
    folder = albert_folder(tmp_path / "projects", task_params=SMALL)
    torch.save(model_of(folder, seed=1).state_dict(), tmp_path / "pytorch_model.bin")
    assert main(["project", "weights", str(tmp_path / "pytorch_model.bin"), str(folder.root)]) == 1
    assert "is not a safetensors file (the only weights a project takes" in capsys.readouterr().err
    assert not (folder.root / INITIAL_WEIGHTS).exists()
