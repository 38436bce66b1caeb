"""`cotrain project export`: a state of a language-model project out as a folder transformers
loads, from a state file or a backbone's newest checkpoint; a damaged state, another
project's, or one of a model since changed is refused, saying so. (tests/collab/
test_own_project.py exports a state trained by a real peer of the README's project.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.authoring.export import newest_checkpoint
from engine.cli import main
from engine.project_folders import load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from engine.training.state import pack
from engine.wire.tensors import MODEL_PREFIX, StateMeta, decode_file, encode_file
from tests.unit.test_authoring import cotrain, texts

pytestmark = pytest.mark.slow


def export(*args: object) -> int:
    return main(["project", "export", *map(str, args)])


def state_bytes(model: torch.nn.Module, project: str, epoch: int) -> bytes:
    tensors = [(f"{MODEL_PREFIX}{k}", v) for k, v in model.state_dict().items()]
    draft = decode_file(encode_file(*pack(tensors, StateMeta(epoch, project, "0" * 64))))
    return encode_file(*pack(tensors, StateMeta(epoch, project, draft.state_sha256())))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, torch.nn.Module, Path]:
    """A gpt2-mini project as the README authors it, a model of it moved off its initial
    weights, and that model's state file."""
    root = tmp_path_factory.mktemp("export")
    folder = root / "gpt"
    cotrain("new", "--preset", "gpt2-mini", folder)
    cotrain("shard", texts(root / "texts"), "--out", folder, "--shard-mb", 0.05)
    cotrain("tokenizer", folder, "--vocab", 2000)
    spec = load_project_folder(folder).spec
    task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(folder)))
    model = initial_model(task, spec.seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    state = root / "trained.state"
    state.write_bytes(state_bytes(model, spec.id, 7))
    return folder, model, state


def test_a_causal_model_loads_in_transformers_as_it_was_trained(trained, tmp_path, capsys):
    folder, model, state = trained
    assert export(folder, "--state", state, "--out", tmp_path / "out") == 0
    assert "epoch 7 of gpt" in capsys.readouterr().out
    loaded, loading = AutoModelForCausalLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not any(loading.values()), loading
    ids = torch.tensor([[5, 17, 300, 1999]])
    model.eval()
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(input_ids=ids).logits, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert (tokenizer.pad_token, tokenizer.eos_token) == ("[PAD]", "[SEP]")
    assert tokenizer.eos_token_id == loaded.config.eos_token_id
    assert tokenizer.pad_token_id == loaded.config.pad_token_id
    assert json.loads((tmp_path / "out" / "cotrain_state.json").read_text())["epoch"] == 7


def test_the_newest_checkpoint_of_the_project_is_taken(trained, tmp_path):
    folder, model, _ = trained
    checkpoints = tmp_path / "backbone" / "checkpoints"
    for number, (project, epoch) in enumerate([("gpt", 10), ("gpt", 30), ("other", 90), ("gpt", 20)]):
        (checkpoints / f"{number:02}").mkdir(parents=True)
        file = checkpoints / f"{number:02}" / f"{project}-{epoch}.ckpt"
        file.write_bytes(state_bytes(model, project, epoch))
    (checkpoints / "04").mkdir()
    (checkpoints / "04" / "partial.ckpt").write_bytes(b"COTRAIN-STATE\0 cut short")
    assert newest_checkpoint(checkpoints, "gpt").name == "gpt-30.ckpt"
    assert export(folder, "--backbone-data", tmp_path / "backbone", "--out", tmp_path / "out") == 0
    assert json.loads((tmp_path / "out" / "cotrain_state.json").read_text())["epoch"] == 30
    with pytest.raises(ValueError, match="no checkpoint of project 'none'"):
        newest_checkpoint(checkpoints, "none")


def damaged(folder: Path, state: Path, tmp_path: Path) -> Path:
    data = bytearray(state.read_bytes())
    data[-3] ^= 0xFF
    (tmp_path / "damaged.state").write_bytes(data)
    return tmp_path / "damaged.state"


def another_projects(folder: Path, state: Path, tmp_path: Path) -> Path:
    text = json.loads(folder.joinpath("project.json").read_text())
    (tmp_path / "theirs").mkdir()
    for name in ("project.json", "tokenizer.json"):
        (tmp_path / "theirs" / name).write_bytes((folder / name).read_bytes())
    (tmp_path / "theirs" / "shards").symlink_to(folder / "shards")
    text["id"] = "theirs"
    (tmp_path / "theirs" / "project.json").write_text(json.dumps(text))
    return state


def a_changed_model(folder: Path, state: Path, tmp_path: Path) -> Path:
    another_projects(folder, state, tmp_path)
    text = json.loads((tmp_path / "theirs" / "project.json").read_text())
    text["id"] = "gpt"
    text["task_params"]["config"]["n_layer"] += 1
    (tmp_path / "theirs" / "project.json").write_text(json.dumps(text))
    return state


@pytest.mark.parametrize("spoil, says", [
    (damaged, "is damaged: its contents hash to"),
    (another_projects, "is a state of project 'gpt', not 'theirs'"),
    (a_changed_model, "does not hold this project's model (it lacks transformer.h.4."),
])
def test_a_state_that_is_not_this_projects_model_is_refused(trained, tmp_path, capsys, spoil, says):
    folder, _, state = trained
    spoilt = spoil(folder, state, tmp_path)
    project = tmp_path / "theirs" if (tmp_path / "theirs").exists() else folder
    assert export(project, "--state", spoilt, "--out", tmp_path / "out") == 1
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists(), "nothing is written"


def test_another_projects_state_or_a_folder_in_use_is_refused(trained, tmp_path, capsys):
    folder, _, state = trained
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("keep")
    assert export(folder, "--state", state, "--out", tmp_path / "used") == 1
    assert "is not empty" in capsys.readouterr().err
    assert (tmp_path / "used" / "mine.txt").read_text() == "keep"
    images = tmp_path / "images"
    cotrain("new", "--preset", "resnet18", images)
    assert export(images, "--state", state, "--out", tmp_path / "out") == 1
    assert "is a state of project 'gpt', not 'images'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
