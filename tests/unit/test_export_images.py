"""`cotrain project export` of an image project: transformers (or torchvision, for its
networks) loads the network with no missing weights, its batch norm's running statistics
measured from the project's pictures (the collaboration keeps none), so in evaluation it
classifies the held-out pictures as the collaboration's network did; transformers' image
processor prepares a picture as the peers did."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification

from engine.cli import main
from engine.project_folders import load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from engine.training.state import pack_state
from engine.wire.tensors import encode_file
from tests.unit.test_authoring import cotrain, images

pytestmark = pytest.mark.slow
SMALL = {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "layer_type": "basic"}
TORCHVISION = "torchvision:resnet18"
# (tests/collab/test_torchvision.py runs the torchvision case in a venv where it loads)
BUILDS = ["resnet", TORCHVISION]


def load_exported(out, architecture: str) -> torch.nn.Module:
    """As a researcher would, with the libraries' own calls and no Cotrain code."""
    if architecture != TORCHVISION:
        model, loading = AutoModelForImageClassification.from_pretrained(out, output_loading_info=True)
        assert not any(loading.values()), loading
        return model
    models = pytest.importorskip("torchvision.models", reason="torchvision does not load beside this torch")
    from safetensors.torch import load_file

    model = models.get_model(**json.loads((out / "torchvision.json").read_text())["get_model"])
    model.load_state_dict(load_file(out / "model.safetensors"))  # (strict: every weight, nothing else)
    return model


@pytest.mark.parametrize("architecture", BUILDS)
def test_an_exported_image_network_classifies_as_the_collaboration_did(tmp_path, architecture):
    if architecture == TORCHVISION:
        pytest.importorskip("torchvision.models", reason="torchvision does not load beside this torch: "
                            "tests/collab/test_torchvision.py runs this in a venv that has it")
    folder = tmp_path / "projects" / "pictures"
    cotrain("new", "--preset", "resnet18", folder)
    cotrain("shard", images(tmp_path / "images"), "--out", folder, "--heldout", 9)
    spec = json.loads((folder / "project.json").read_text())
    spec["task_params"].update(micro_batch=9, architecture=architecture,
                               config=SMALL if architecture != TORCHVISION else {})
    (folder / "project.json").write_text(json.dumps(spec))
    project = load_project_folder(folder).spec
    task = create_task(project.task, dict(project.task_params), TaskData(project.data, FolderFiles(folder)))
    model = initial_model(task, project.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.02)
    for step in range(30):
        optimizer.zero_grad()
        task.loss(model, task.batch(0, step)).backward()
        optimizer.step()
    (tmp_path / "pictures.state").write_bytes(encode_file(*pack_state(model, optimizer, 30, project.id)))
    assert main(["project", "export", str(folder), "--state", str(tmp_path / "pictures.state"),
                 "--out", str(tmp_path / "out")]) == 0

    out = tmp_path / "out"
    exported = load_exported(out, architecture)
    exported.eval()
    model.eval()
    agree = total = 0
    with torch.no_grad():
        for batch in task.heldout():
            ours = task.logits(model, batch).argmax(-1)
            pixels = batch.tensors["pixel_values"]
            theirs = (exported(pixel_values=pixels).logits if architecture != TORCHVISION
                      else exported(pixels)).argmax(-1)
            agree += int((theirs == ours).sum())
            total += batch.size
    assert total == 9 and agree >= 8, (agree, total)  # (one batch of 9: its own statistics are not noise)

    # The exported folder starts a new project where this one left off (its batch norm's
    # measured statistics, which the collaboration keeps none of, left aside).
    assert main(["project", "weights", str(out), str(folder)]) == 0
    project = load_project_folder(folder).spec
    again = initial_model(create_task(project.task, dict(project.task_params),
                                      TaskData(project.data, FolderFiles(folder))), project.seed + 1)
    trained = dict(model.named_parameters())
    assert all(torch.equal(p, trained[name]) for name, p in again.named_parameters())
    if architecture == TORCHVISION:
        return

    processor = AutoImageProcessor.from_pretrained(out)
    picture = next((tmp_path / "images" / "grey").iterdir())
    pixels = processor(Image.open(picture).convert("RGB"), return_tensors="pt")["pixel_values"][0]
    raw = torch.from_numpy(np.array(Image.open(picture).convert("RGB"))).permute(2, 0, 1).float() / 255
    mean, std = (torch.tensor(project.task_params[k]).view(-1, 1, 1) for k in ("mean", "std"))
    assert torch.allclose(pixels, (raw - mean) / std, atol=1e-5)
