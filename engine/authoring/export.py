"""``cotrain project export``: the model a collaboration trained, as a folder transformers'
``from_pretrained`` loads (or torchvision, for its networks: export_images.py), so a
researcher gets it out without Cotrain's own code.

From a Cotrain state file (what ``cotrain peer --save-state`` writes, or a checkpoint the
backbone keeps): its hash is checked, its weights must be exactly the project's model's, and
the folder gets the model's weights (safetensors) and configuration, the project's tokenizer
with its special tokens named (padding, and end of text or the masked-LM tokens), and
``cotrain_state.json`` saying which project, epoch and state it is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.project_folders import PROJECT_FILE, read_project_file
from engine.wire import ProtocolError
from engine.wire.tensors import FILE_MAGIC, StateFile, decode_file, read_state_meta

EXPORTED = ("hf-masked-lm", "hf-causal-lm", "image-classification")
PROVENANCE = "cotrain_state.json"


def newest_checkpoint(checkpoints: Path, project_id: str) -> Path:
    """The checkpoint of ``project_id`` with the highest epoch among a backbone's files."""
    found: list[tuple[int, Path]] = []
    for path in checkpoints.glob("*/*.ckpt"):
        try:
            meta = read_state_meta(path)
        except (OSError, ProtocolError):
            continue  # (a file being written, or not a state file: not a checkpoint to export)
        if meta.project == project_id:
            found.append((meta.epoch, path))
    if not found:
        raise ValueError(f"{checkpoints} holds no checkpoint of project {project_id!r}")
    return max(found)[1]


def read_state(path: Path) -> StateFile:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not data.startswith(FILE_MAGIC):
        raise ValueError(f"{path} is not a Cotrain state file (--save-state, or a backbone's checkpoint)")
    try:
        state = decode_file(data)
        actual = state.state_sha256()
    except ProtocolError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if actual != state.meta.state_sha256:
        raise ValueError(f"{path} is damaged: its contents hash to {actual[:12]}, "
                         f"not the {state.meta.state_sha256[:12]} it names")
    return state


def export(folder: Path, state_path: Path, out: Path) -> StateFile:
    """Write ``out`` from the state at ``state_path`` of the project in ``folder``."""
    from engine.authoring.export_images import export_image_model
    from engine.shards.files import FolderFiles
    from engine.tasks import TaskData, create_task
    from engine.tasks.images import ImageClassification

    spec = read_project_file(folder / PROJECT_FILE)
    if spec.task not in EXPORTED:
        raise ValueError(f"{spec.id} is a {spec.task!r} project; export takes {', '.join(EXPORTED)} projects")
    state = read_state(state_path)
    if state.meta.project != spec.id:
        raise ValueError(f"{state_path} is a state of project {state.meta.project!r}, not {spec.id!r}")
    task = create_task(spec.task, dict(spec.task_params), TaskData(spec.data, FolderFiles(folder)))
    model: Any = task.build_model()  # (a transformers PreTrainedModel, but for torchvision's)
    _load_weights(model, state, state_path)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty: export writes a folder of its own")
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(task, ImageClassification):
        export_image_model(task, model.state_dict(), out, spec.seed)
    else:
        model.save_pretrained(str(out), safe_serialization=True)
        hf_tokenizer(task).save_pretrained(str(out))
    (out / PROVENANCE).write_text(json.dumps({"project": spec.id, "epoch": state.meta.epoch,
                                              "state_sha256": state.meta.state_sha256}, indent=2) + "\n")
    return state


def _load_weights(model, state: StateFile, state_path: Path) -> None:
    from engine.training.state import tensors_of
    from engine.wire.tensors import MODEL_PREFIX

    weights = {name[len(MODEL_PREFIX):]: tensor for name, tensor in tensors_of(state).items()
               if name.startswith(MODEL_PREFIX)}
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(weights)), sorted(set(weights) - set(own))
    shapes = [name for name in set(own) & set(weights) if own[name].shape != weights[name].shape]
    if missing or unexpected or shapes:
        said = [f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                for what, names in (("lacks", missing), ("has unknown", unexpected), ("reshapes", shapes))
                if names]
        raise ValueError(f"{state_path} does not hold this project's model (it {'; '.join(said)}): "
                         "was the project's model changed after it was trained?")
    model.load_state_dict(weights)


def hf_tokenizer(task):
    """The project's tokenizer as transformers' fast tokenizer, its special tokens named as
    the task uses them (a masked LM's text comes between [CLS] and [SEP], as it trained)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from engine.tasks.language_models import MaskedLMParams

    tokenizer, p = task.tokenizer(), task.params
    if isinstance(p, MaskedLMParams):
        cls, sep = p.cls_token, p.sep_token
        tokenizer.post_processor = TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))])
        named = dict(cls_token=cls, sep_token=sep, mask_token=p.mask_token)
    else:
        named = dict(eos_token=p.end_token, bos_token=p.end_token)
    unknown = "[UNK]" if tokenizer.token_to_id("[UNK]") is not None else None
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=p.pad_token, unk_token=unknown,
                                   model_max_length=p.seq_len, **named)
