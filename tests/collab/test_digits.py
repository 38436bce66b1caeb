"""The catalog's ``digits`` project trains: built from scikit-learn's bundled digits, a
single-process reference loop (the project's optimizer, schedule and batch size, no peers)
reaches 90% held-out accuracy within a bounded number of steps."""

import time
from pathlib import Path

import pytest
import torch

from engine.authoring.check import check_project
from engine.catalog_data.digits import build_digits
from engine.project import ProjectSpec
from engine.project_folders import PROJECT_FILE, load_project_folder
from engine.shards.files import FolderFiles
from engine.tasks import Task, TaskData, create_task, initial_model
from engine.training.lr_schedule import build_optimizer, lr_at

pytestmark = pytest.mark.slow
STEPS = 20  # at 512 samples a step, about seven passes over the 1438 training digits


def digits_folder(tmp_path: Path) -> Path:
    """The digits project's folder, built in ``tmp_path`` (for tests that train on it)."""
    pytest.importorskip("sklearn", reason="the digits come from scikit-learn's bundled copy")
    folder = tmp_path / "digits"
    build_digits(folder)
    return folder


def heldout_accuracy(task: Task, model: torch.nn.Module) -> float:
    model.eval()
    correct = count = 0
    for batch in task.heldout():
        correct += int(task.metrics(model, batch)["accuracy"])
        count += batch.size
    model.train()
    return correct / count


def train(spec: ProjectSpec, task: Task, steps: int) -> torch.nn.Module:
    """What a lone peer does: a step every target_batch_size samples of its own micro-batches."""
    model = initial_model(task, spec.seed)
    optimizer = build_optimizer(spec.optimizer, model.parameters())
    micro_batches = spec.target_batch_size // task.batch(spec.seed, 0).size
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(spec.schedule, spec.optimizer.lr, step)
        optimizer.zero_grad()
        for k in range(micro_batches):
            (task.loss(model, task.batch(spec.seed, step * micro_batches + k)) / micro_batches).backward()
        assert spec.optimizer.clip_grad_norm is not None
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.optimizer.clip_grad_norm)
        optimizer.step()
    return model


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_digits_project_trains_past_90_percent(tmp_path, report_figure, one_thread):
    folder = digits_folder(tmp_path)
    project = load_project_folder(folder)
    spec = project.spec
    assert spec.id == "digits" and spec.task == "image-classification"
    assert spec.data is not None and len(spec.data.shards) >= 3 and len(spec.data.heldout) >= 1
    again = digits_folder(tmp_path / "again")
    assert (again / PROJECT_FILE).read_text() == (folder / PROJECT_FILE).read_text()  # same hashes
    said: list[str] = []
    assert check_project(folder, said.append), said

    task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(folder)))
    began = time.perf_counter()
    before = heldout_accuracy(task, initial_model(task, spec.seed))
    model = train(spec, task, STEPS)
    accuracy = heldout_accuracy(task, model)
    seconds = time.perf_counter() - began
    report_figure(f"held-out accuracy {before:.1%} -> {accuracy:.1%} after {STEPS} steps of "
                  f"{spec.target_batch_size}, {seconds:.1f} s on one thread")
    assert before < 0.3
    assert accuracy >= 0.9
