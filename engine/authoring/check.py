"""``cotrain project check``: everything a peer will need, checked before volunteers find out.

Schema errors name the field; the model is counted on the meta device; the tokenizer is
matched to the model's vocabulary; every file's hash is checked; one real batch goes through
the model."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from engine.project import ProjectSpec
from engine.project_folders import PROJECT_FILE, is_url, read_project_file
from engine.shards.download import FileError
from engine.shards.files import FolderFiles

MB = 2**20


def measure_needs(root: Path) -> dict[str, int]:
    """The model's parameters and a peer's memory (the project's ``needs``)."""
    from engine.tasks import TaskData, create_task

    spec = read_project_file(root / PROJECT_FILE)
    task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(root)))
    parameters = getattr(task, "parameters", lambda: 0)()
    return {"parameters": parameters, "memory_mb": (task.memory_needed() or 0) // MB}


def check_project(root: Path, say: Callable[[str], None]) -> bool:
    """Says each finding; True when a peer could train on the project as it is."""
    try:
        spec = read_project_file(root / PROJECT_FILE)
    except ValueError as exc:
        say(f"✗ {exc}")
        return False
    say(f"project {spec.id!r}: {spec.title} ({spec.task})")
    ok = _check_files(spec, root, say)
    return _check_model(spec, root, say) and ok


def _check_files(spec: ProjectSpec, root: Path, say: Callable[[str], None]) -> bool:
    if spec.data is None:
        say("· no data files (the task brings its own)")
        return True
    files, bad = FolderFiles(root), 0
    for ref in spec.data.files():
        if is_url(ref.path):
            say(f"· {ref.path}: on the web, checked by each peer as it arrives")
            continue
        try:
            files.local(ref)
        except FileError as exc:
            say(f"✗ {exc}")
            bad += 1
    count = len(spec.data.files())
    if not bad:
        say(f"✓ {count} files, {spec.data.total_bytes() / MB:.1f} MB, each as its sha256 says "
            f"({len(spec.data.shards)} shards, {len(spec.data.heldout)} held out)")
    return not bad


def _check_model(spec: ProjectSpec, root: Path, say: Callable[[str], None]) -> bool:
    from engine.tasks import TaskData, create_task, initial_model
    from engine.tasks.hf_models import failed_on_a_batch
    from engine.tasks.language_models import LanguageModel

    try:  # (the schema's, the model's size and the data's errors each say what is wrong)
        task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(root)))
        needed, micro_batch = task.memory_needed(), getattr(getattr(task, "params", None), "micro_batch", "?")
        if needed is not None and hasattr(task, "parameters"):
            say(f"✓ model: {task.parameters():,} parameters; about {needed / MB:,.0f} MB for each peer "
                f"at {micro_batch} samples a micro-batch")
        free = psutil.virtual_memory().available
        if needed is not None and needed > free:  # (one batch of it would have the kernel kill us)
            say(f"✗ a peer needs about {needed / MB:,.0f} MB for this model at {micro_batch} samples a "
                f"micro-batch; this computer has {free / MB:,.0f} MB free, so the check runs no batch: "
                "make the model or the micro-batch smaller")
            return False
        if isinstance(task, LanguageModel):
            size = task.tokenizer().get_vocab_size()
            say(f"✓ tokenizer: {size} tokens, for a vocabulary of {task.cfg.vocab_size}")
        began = time.perf_counter()
        model = initial_model(task, spec.seed)
        batch = task.batch(0, 0)
    except (ValueError, OSError, RuntimeError) as exc:
        say(f"✗ {exc}")
        return False
    try:
        loss = task.loss(model, batch)
        loss.backward()
    except Exception as exc:  # (what a model's own code raises on a batch it cannot take)
        say(f"✗ {failed_on_a_batch(exc)}")
        return False
    if not math.isfinite(loss.item()):
        say(f"✗ one batch of {batch.size} through the model gives a loss of {loss.item()}")
        return False
    say(f"✓ one batch of {batch.size} through the model and back: loss {loss.item():.3f}, "
        f"{time.perf_counter() - began:.1f} s")
    return True
