"""Compute overhead: samples/s of one collaborative peer against a plain PyTorch loop on the
same model, micro-batch and target batch: demo-lm as shipped, and the catalog's albert-mini
(a transformers ALBERT) and digits (a transformers ResNet) on their shards, served by the
backbone; digits again with overlapped rounds (the project option ``overlap``), and on
torchvision's ResNet-18 where torchvision loads (in the venv tests/torchvision_venv.py makes:
``.venv-torchvision/bin/python -m tests.bench.compute --only torchvision``).

Five alternating runs of at least 20 s each; the ratio is the median of each peer run's
over the plain run just before it (a shared machine's speed drifts by 10% within minutes:
pairs side by side cancel most of it). The peer's time is counted from its first step
after its link measurement (3 s when it joins, then one every half hour: a seventh of a
20-s run, not of a volunteer's session) to its last; checkpoints and held-out scores,
which the plain loop does not compute, are off.

    python -m tests.bench.compute [--quick] [--only PROJECT]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from msgspec.structs import replace

from engine.catalog_data import builtin_folder
from engine.peer.events import EpochCompleted
from engine.peer.options import PeerOptions
from engine.peer.runner import Peer
from engine.project import ProjectSpec, load_catalog
from engine.project_folders import ProjectFolder
from engine.resources import default_catalog
from engine.shards.files import FolderFiles
from engine.tasks import TaskData, create_task, initial_model
from engine.training.lr_schedule import build_optimizer, lr_at
from engine.wire.codec import encode


def workloads(root: Path) -> list[tuple[str, ProjectSpec, ProjectFolder | None]]:
    """(name, project, its folder) of each workload."""
    (demo,) = [p for p in load_catalog(default_catalog()) if p.id == "demo-lm"]
    folders = [builtin_folder(root, name) for name in ("albert-mini", "digits")]
    found = [(f.spec.id, f.spec, f) for f in folders if f is not None]
    digits = [(spec, f) for _, spec, f in found if spec.id == "digits"]
    overlapped = [("digits-overlap", replace(spec, overlap=True), f) for spec, f in digits]
    vision = []
    if importlib.util.find_spec("torchvision") is not None:
        params = {"architecture": "torchvision:resnet18", "config": {}}
        vision = [("torchvision", replace(spec, task_params={**spec.task_params, **params}), f)
                  for spec, f in digits]
    else:
        print("(no torchvision workload: torchvision does not load here; run this with the python "
              "of .venv-torchvision, which tests/collab/test_torchvision.py makes)")
    return [("demo-lm", demo, None), *found, *overlapped, *vision]


def plain_loop(spec: ProjectSpec, folder: ProjectFolder | None, epochs: int) -> float:
    """Samples/s of the textbook loop: accumulate micro-batches, step every target batch."""
    files = FolderFiles(folder.root) if folder else None
    task = create_task(spec.task, spec.task_params, TaskData(spec.data, files))
    model = initial_model(task, spec.seed)
    optimizer = build_optimizer(spec.optimizer, model.parameters())
    micro = spec.task_params["micro_batch"]
    per_step = -(-spec.target_batch_size // micro)
    samples, began = 0, time.perf_counter()
    for epoch in range(epochs):
        for i in range(per_step):
            batch = task.batch(1, epoch * per_step + i)
            (task.loss(model, batch) * batch.size / (per_step * micro)).backward()
            samples += batch.size
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.optimizer.clip_grad_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(spec.schedule, spec.optimizer.lr, epoch)
        optimizer.step()
        optimizer.zero_grad()
    return samples / (time.perf_counter() - began)


def served(spec: ProjectSpec, folder: ProjectFolder | None, where: Path) -> list[str]:
    """`cotrain backbone` arguments that serve ``spec`` (with its folder's files) from ``where``."""
    if folder is None:
        catalog = where / "catalog.json"
        catalog.write_bytes(encode({"projects": [spec]}))
        return ["--catalog", str(catalog)]
    projects = where / "projects"
    shutil.copytree(folder.root, projects / spec.id)
    (projects / spec.id / "project.json").write_bytes(encode(spec))
    return ["--catalog", str(where / "none.json"), "--projects", str(projects)]


def collaborative(spec: ProjectSpec, folder: ProjectFolder | None, epochs: int) -> float:
    """Samples/s of a solo Cotrain peer over ``epochs`` steps after its link measurement. Its
    backbone runs in a process of its own, as it does for volunteers (in the peer's process
    it took a quarter of the peer's time on digits)."""
    spec = replace(spec, checkpoint_every=10**6, evaluate_every=10**6)

    async def run(url: str) -> float:
        steps: list[tuple[float, int]] = []  # (when, samples brought so far), after the link probe

        def on_event(event):
            if isinstance(event, EpochCompleted) and (steps or not peer.bandwidth.probe_due()):
                steps.append((time.perf_counter(), (steps[-1][1] if steps else 0) + event.my_samples))
                if len(steps) > epochs:
                    peer.stop("measured")

        peer = Peer(PeerOptions(url, spec.id, "bench", threads=1, ice_addresses=["127.0.0.1"]), on_event)
        if await peer.run() != "measured":
            raise RuntimeError(f"the peer stopped before {epochs} steps after its link measurement")
        (began, before), (ended, after) = steps[0], steps[-1]
        return (after - before) / (ended - began)

    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        (where / "none.json").write_text('{"projects": []}')
        backbone = subprocess.Popen([sys.executable, "-m", "engine", "backbone", "--port", "0",
                                     "--data-dir", str(where / "data"), *served(spec, folder, where)],
                                    stdout=subprocess.PIPE, text=True)
        try:
            assert backbone.stdout is not None
            line = backbone.stdout.readline()
            if not line.startswith("backbone listening on "):
                raise RuntimeError(f"the backbone did not start: {line!r}")
            return asyncio.run(run(line.split()[-1]))
        finally:
            backbone.terminate()
            backbone.wait(timeout=30)


RUN_SECONDS = 20.0


def main(quick: bool = False, only: str | None = None) -> None:
    torch.set_num_threads(1)
    least, trials = (2, 1) if quick else (4, 5)
    with tempfile.TemporaryDirectory() as root:
        os.environ["COTRAIN_HOME"] = root  # the peer's shard cache
        for name, spec, folder in workloads(Path(root)):
            if only is not None and name != only:
                continue
            # Runs of at least RUN_SECONDS: a peer measures its link for 3 s when it joins,
            # once in half an hour, and a run of a few steps would be mostly that.
            epochs = least
            if not quick:
                pace = plain_loop(spec, folder, 1)
                epochs = max(least, math.ceil(RUN_SECONDS * pace / spec.target_batch_size))
            print(f"\n== Compute overhead: {spec.id}{', overlapped rounds' if spec.overlap else ''} "
                  f"({spec.task}, {spec.task_params.get('architecture', 'its own model')}), micro-batch "
                  f"{spec.task_params['micro_batch']}, target batch {spec.target_batch_size}, 1 thread, "
                  f"{epochs} steps per run, {trials} alternating runs each", flush=True)
            plain, ours = [], []
            for _ in range(trials):
                plain.append(plain_loop(spec, folder, epochs))
                ours.append(collaborative(spec, folder, epochs))
            p, c = statistics.median(plain), statistics.median(ours)
            pairs = statistics.median(o / q for o, q in zip(ours, plain, strict=True))
            print(f"plain PyTorch loop   {p:8.2f} samples/s   runs: {', '.join(f'{x:.2f}' for x in plain)}")
            print(f"collaborative peer   {c:8.2f} samples/s   runs: {', '.join(f'{x:.2f}' for x in ours)}")
            print(f"ratio collaborative / plain: {pairs:.3f} (target >= 0.95), the median of each run's over "
                  f"the plain run just before it; of the medians {c / p:.3f}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short pair of runs per workload")
    parser.add_argument("--only", metavar="WORKLOAD",
                        help="only this one: demo-lm, albert-mini, digits, digits-overlap, torchvision")
    args = parser.parse_args()
    main(args.quick, args.only)
