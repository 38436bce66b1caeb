"""A project's author sends a pickle that runs code when loaded, named as the project's
initial weights and listed with its true hash: volunteers' peers (and `project check`)
refuse it as not safetensors, and the code never runs."""

import pickle
from pathlib import Path

import pytest

from engine.authoring.manifest import INITIAL_WEIGHTS, update_manifest
from engine.cli import main
from engine.project_folders import load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from engine.tasks.hf_models import ModelError
from tests.projects import albert_folder

pytestmark = pytest.mark.slow


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_weights_that_are_a_pickle_with_a_payload_never_run_it(tmp_path, capsys):
    folder = albert_folder(tmp_path / "projects", task_params={"seq_len": 32, "micro_batch": 2})
    marker = tmp_path / "the-payload-ran"
    (folder.root / INITIAL_WEIGHTS).write_bytes(pickle.dumps({"weight": Payload(marker)}))
    update_manifest(folder.root)  # (listed with its true hash: the file is what the author sent)
    spec = load_project_folder(folder.root).spec
    task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(folder.root)))
    with pytest.raises(ModelError, match="are not a safetensors file"):
        initial_model(task, spec.seed)
    assert main(["project", "check", str(folder.root)]) == 1
    assert "not a safetensors file" in capsys.readouterr().out
    assert not marker.exists()
