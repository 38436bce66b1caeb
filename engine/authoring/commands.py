"""``cotrain project new|shard|tokenizer|check|export|weights|curve``: from a folder of texts
to a project folder that ``cotrain backbone --projects`` serves, its learning curve, the
trained model out of it, and pretrained weights into it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from engine.authoring.manifest import (
    IMAGE_TASK,
    SHARDS,
    TOKENIZER,
    file_entry,
    read_project,
    update_manifest,
    write_project,
)
from engine.authoring.presets import PRESETS

TEXT_TASKS = {"hf-masked-lm", "hf-causal-lm"}


def add_project_parser(sub, add_logging) -> None:
    project = sub.add_parser("project", help="write, shard, tokenize and check a project folder")
    commands = project.add_subparsers(dest="project_command", required=True)
    new = commands.add_parser("new", help="a project folder to edit, from a preset")
    new.add_argument("--preset", choices=sorted(PRESETS), required=True)
    new.add_argument("--id", default=None, help="the project's id (default: the folder's name)")
    new.add_argument("folder", type=Path)
    shard = commands.add_parser("shard", help="cut texts (.txt, .jsonl, .parquet), or a folder of class "
                                              "folders of images, into the project's shards")
    shard.add_argument("inputs", type=Path, nargs="+", metavar="FILE_OR_FOLDER")
    shard.add_argument("--out", type=Path, required=True, metavar="FOLDER", help="the project folder")
    shard.add_argument("--shard-mb", type=float, default=64.0, help="about this many MB a shard (default 64)")
    held = shard.add_mutually_exclusive_group()
    held.add_argument("--heldout-every", type=int, default=50, metavar="N",
                      help="every N-th document (or image) goes to the held-out set (default 50)")
    held.add_argument("--heldout", type=int, default=None, metavar="COUNT",
                      help="this many documents (or images) go to the held-out set, spread evenly")
    shard.add_argument("--text-field", default="text", metavar="NAME",
                       help="the JSONL field or Parquet column that holds the text (default: text)")
    tokenizer = commands.add_parser("tokenizer", help="train the project's tokenizer on its shards")
    tokenizer.add_argument("folder", type=Path)
    tokenizer.add_argument("--vocab", type=int, default=None, help="tokens (default: the model's vocab_size)")
    check = commands.add_parser("check", help="check all a peer will need")
    check.add_argument("folder", type=Path)
    export = commands.add_parser("export", help="the trained model as a folder transformers' from_pretrained "
                                                "loads (weights, configuration, tokenizer)")
    export.add_argument("folder", type=Path, help="the project folder")
    export.add_argument("--out", type=Path, required=True, metavar="FOLDER", help="a new or empty folder")
    source = export.add_mutually_exclusive_group()
    source.add_argument("--state", type=Path, default=None, metavar="FILE",
                        help="a state file (cotrain peer --save-state, or a checkpoint file)")
    source.add_argument("--backbone-data", type=Path, default=None, metavar="DIR",
                        help="the newest checkpoint a backbone keeps in DIR (default: this computer's "
                             "backbone's, when --state is not given)")
    weights = commands.add_parser("weights", help="start the project's model from these weights (a "
                                                  "safetensors file, or what `project export` wrote)")
    weights.add_argument("source", type=Path, metavar="FILE_OR_FOLDER")
    weights.add_argument("folder", type=Path, help="the project folder")
    curve = commands.add_parser("curve", help="a project's learning curve in the terminal")
    curve.add_argument("backbone", metavar="URL", help="the backbone, e.g. http://host:8470")
    curve.add_argument("project", metavar="ID")
    curve.add_argument("--text", action="store_true", help="print it only, even where a window could show it")
    for command in (new, shard, tokenizer, check, export, weights, curve):
        add_logging(command)


def run_project_command(args: argparse.Namespace) -> int:
    try:
        if args.project_command == "new":
            return _new(args.folder, args.preset, args.id)
        if args.project_command == "shard":
            return _shard(args)
        if args.project_command == "tokenizer":
            return _tokenizer(args.folder, args.vocab)
        if args.project_command == "export":
            return _export(args)
        if args.project_command == "weights":
            return _weights(args.source, args.folder)
        if args.project_command == "curve":
            from engine.authoring.curve import curve_window, show_curve

            return show_curve(args.backbone, args.project, print, None if args.text else curve_window())
        return _check(args.folder)
    except (ValueError, OSError) as exc:
        print(f"cotrain project {args.project_command}: {exc}", file=sys.stderr)
        return 1


def _check(folder: Path) -> int:
    from engine.authoring.check import check_project, measure_needs

    if not check_project(folder, print):
        return 1
    project = read_project(folder)
    project["needs"] = measure_needs(folder)
    write_project(folder, project)
    print(f"recorded what a peer needs in {folder / 'project.json'}: it is shown before Join")
    return 0


def _new(folder: Path, preset: str, project_id: str | None) -> int:
    if (folder / "project.json").exists():
        raise ValueError(f"{folder} holds a project already")
    project = {"id": _project_id(folder, project_id), **json.loads(json.dumps(PRESETS[preset]))}
    folder.mkdir(parents=True, exist_ok=True)
    write_project(folder, project)
    inputs = "YOUR_CLASS_FOLDERS" if project.get("task") == IMAGE_TASK else "YOUR_TEXTS"
    print(f"wrote {folder / 'project.json'} ({preset}); next: "
          f"cotrain project shard {inputs} --out {folder}")
    return 0


def _project_id(folder: Path, given: str | None) -> str:
    """The id asked for, or the folder's name: checked now, not when the project is checked."""
    from typing import get_args

    from engine.wire.types import ProjectId

    chosen = given or folder.resolve().name.lower()
    if re.fullmatch(get_args(ProjectId)[1].pattern, chosen):
        return chosen
    suggestion = re.sub(r"[^a-z0-9]+", "-", chosen.lower()).strip("-")[:63] or "my-project"
    raise ValueError(f"{chosen!r} cannot be a project's id (lowercase letters, digits and '-', at most 63, "
                     f"starting with a letter or digit): give --id {suggestion}, or name the folder so")


def _shard(args: argparse.Namespace) -> int:
    from engine.authoring.text_shards import cut_text

    project = read_project(args.out)
    if project.get("task") == IMAGE_TASK:
        return _shard_images(args, project)
    if project.get("task") not in TEXT_TASKS:
        raise ValueError(f"{args.out} is a {project.get('task')!r} project; this cuts text")
    count, held = cut_text(args.inputs, args.out, int(args.shard_mb * 2**20), max(2, args.heldout_every),
                           args.text_field, args.heldout)
    data = update_manifest(args.out)
    print(f"{count} documents: {len(data['shards'])} shards in {args.out / SHARDS}, {held} held out")
    if not (args.out / TOKENIZER).exists():
        return _tokenizer(args.out, None)
    return 0


def _shard_images(args: argparse.Namespace, project: dict) -> int:
    """One folder with a subfolder of images per class; the class count becomes num_classes,
    and image_size is never more than the images' own (32x32 images stayed at 224)."""
    from engine.authoring.image_shards import cut_images

    if len(args.inputs) != 1:
        raise ValueError("an image project is cut from one folder, with a subfolder of images per class")
    count, held, names, side = cut_images(args.inputs[0], args.out, int(args.shard_mb * 2**20),
                                          max(2, args.heldout_every), args.heldout)
    params = project.setdefault("task_params", {})
    params["num_classes"] = len(names)
    params["image_size"] = min(int(params.get("image_size", side)), side)
    write_project(args.out, project)
    data = update_manifest(args.out)
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    print(f"{count} images of {len(names)} classes ({shown}): {len(data['shards'])} shards in "
          f"{args.out / SHARDS}, {held} held out; image_size {params['image_size']} (the images' "
          f"median shorter side: {side} pixels)")
    return 0


def _tokenizer(folder: Path, vocab: int | None) -> int:
    from engine.authoring.tokenizer import tokenize_project

    print(f"training a tokenizer on the shards in {folder / SHARDS}")
    size = tokenize_project(folder, vocab)
    print(f"wrote {folder / TOKENIZER}: {size} tokens (the model's vocab_size is set to match)")
    return 0


def _export(args: argparse.Namespace) -> int:
    from engine.authoring.export import export, newest_checkpoint
    from engine.paths import user_data_dir
    from engine.project_folders import PROJECT_FILE, read_project_file

    state = args.state
    if state is None:
        checkpoints = (args.backbone_data or user_data_dir() / "backbone") / "checkpoints"
        state = newest_checkpoint(checkpoints, read_project_file(args.folder / PROJECT_FILE).id)
    exported = export(args.folder, state, args.out)
    print(f"wrote {args.out}: epoch {exported.meta.epoch} of {exported.meta.project} "
          f"(state {exported.meta.state_sha256[:12]}, from {state}); load it with "
          f"transformers' from_pretrained({str(args.out)!r})")
    return 0


def _weights(source: Path, folder: Path) -> int:
    """The weights go into the folder as initial.safetensors, listed in its manifest; whether
    they fit the model is `project check`'s (it builds the model)."""
    import shutil

    from safetensors import SafetensorError, safe_open

    from engine.authoring.manifest import INITIAL_WEIGHTS

    project = read_project(folder)  # (a project folder, before anything is copied into it)
    path = source / "model.safetensors" if source.is_dir() else source
    try:
        with safe_open(str(path), framework="pt") as weights:
            count = len(list(weights.keys()))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path} is not a safetensors file (the only weights a project takes: "
                         f"reading them runs no code): {exc}") from None
    shutil.copyfile(path, folder / INITIAL_WEIGHTS)
    if isinstance(project.get("data"), dict):  # (its shards are listed already: not hashed again)
        project["data"]["initial_weights"] = file_entry(folder, folder / INITIAL_WEIGHTS)
        write_project(folder, project)
    else:
        update_manifest(folder)
    print(f"{folder / INITIAL_WEIGHTS}: the model starts from these {count} tensors; "
          f"`cotrain project check {folder}` checks that they fit it")
    return 0
