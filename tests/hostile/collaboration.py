"""A collaboration as users run it -- `cotrain backbone` and `cotrain peer --json`, each its
own process -- watched from outside: the epochs each honest peer prints, the backbone's
SQLite file (read-only), the processes' memory. Hostile tests attack it and measure."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import psutil
import torch

from engine.averaging.powersgd import warm_shapes_of
from engine.backbone.checkpoints import CheckpointFiles
from engine.paths import engine_command
from engine.project import ProjectSpec
from engine.project_folders import ProjectFolder
from engine.tasks import create_task, initial_model
from engine.training.accumulator import GradientAccumulator
from engine.training.local import LocalSteps
from engine.training.lr_schedule import build_optimizer, collaboration_optimizer, lr_at
from engine.training.params import trainable
from engine.training.state import load_state, warm_slots
from engine.wire.tensors import decode_file
from tests import launcher
from tests.collab.harness import TINY, tiny_project
from tests.collab.processes import write_catalog


def hostile_project(**overrides) -> ProjectSpec:
    """A small, quick project: rounds of three peers finish in well under a second."""
    settings = {"target_batch_size": 96, "round_timeout": 3, "checkpoint_every": 1000,
                "task_params": dict(TINY, micro_batch=12)}
    return tiny_project(**{**settings, **overrides})


@dataclass
class Process:
    name: str
    popen: subprocess.Popen | launcher.LaunchedProcess
    log: Path

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def rss(self) -> int:
        return psutil.Process(self.popen.pid).memory_info().rss

    def fds(self) -> int:
        """Open files and sockets."""
        return psutil.Process(self.popen.pid).num_fds()

    def stop(self) -> None:
        if self.alive:
            self.popen.terminate()
            try:
                self.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class HonestPeer(Process):
    epochs: list[dict] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic time of each epoch line

    @property
    def epoch(self) -> int:
        return self.epochs[-1]["epoch"] if self.epochs else 0

    def read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.epochs.append(json.loads(line))
            self.arrivals.append(time.monotonic())


class Collaboration:
    """A backbone and ``peers`` honest peers on loopback (127.0.0.1)."""

    def __init__(self, root: Path, project: ProjectSpec | None = None, peers: int = 3,
                 backbone_args: tuple[str, ...] = (), folder: ProjectFolder | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.project = folder.spec if folder else project or hostile_project()
        self.folder = folder  # a project with data, served from its folder
        self.names = [f"honest-{i}" for i in range(peers)]
        self.backbone_args = backbone_args
        self.peers: list[HonestPeer] = []
        self.backbone: Process | None = None
        self.url = ""

    # --- running ------------------------------------------------------------------------

    def start_backbone(self, port: int = 0) -> None:
        """Start the backbone (on ``port``, or any free one), its data kept in ``root``."""
        catalog = write_catalog(self.root / "catalog.json", *([] if self.folder else [self.project]))
        folders = ["--projects", str(self.folder.root.parent)] if self.folder else []
        log = self.root / "backbone.log"
        popen = launcher.popen(
            [*engine_command(), "backbone", "--port", str(port), "--data-dir", str(self.root / "backbone"),
             "--catalog", str(catalog), *folders, *self.backbone_args],
            stdout=subprocess.PIPE, stderr=log.open("ab"), stdin=subprocess.DEVNULL, text=True)
        self.backbone = Process("backbone", popen, log)
        assert popen.stdout is not None
        line = popen.stdout.readline()  # "backbone listening on URL", or nothing if it died
        assert line.startswith("backbone listening on "), self.backbone.tail()
        self.url = line.split()[-1]

    def start_peer(self, name: str, *args: str, command: list[str] | None = None) -> HonestPeer:
        """A peer as users start it (or, with ``command``, a modified one that takes the same
        arguments)."""
        log = self.root / f"{name}.log"
        popen = launcher.popen(
            [*(command or engine_command()), "peer", "--backbone", self.url, "--project", self.project.id,
             "--name", name, "--json", "--threads", "1", *args],
            stdout=subprocess.PIPE, stderr=log.open("wb"), stdin=subprocess.DEVNULL, text=True,
            env={**os.environ, **({"COTRAIN_HOME": str(self.root / f"{name}-home")} if self.folder else {})})
        peer = HonestPeer(name, popen, log)
        threading.Thread(target=peer.read, daemon=True).start()
        self.peers.append(peer)
        return peer

    def start(self, warm_up_epochs: int = 3, timeout: float = 120) -> None:
        self.start_backbone()
        for name in self.names:
            self.start_peer(name)
        self.wait_for(lambda: all(p.epoch >= warm_up_epochs for p in self.peers), timeout,
                      f"every honest peer at epoch {warm_up_epochs}")

    def stop(self) -> None:
        """Stop the peers together (each takes its leave on its own), then the backbone."""
        for peer in self.peers:
            if peer.alive:
                peer.popen.terminate()
        for process in [*self.peers, self.backbone]:
            if process is not None:
                process.stop()

    def wait_for(self, condition, timeout: float, what: str) -> None:
        """Block until ``condition()`` (for set-up, outside any event loop)."""
        deadline = time.monotonic() + timeout
        while not self._settled(condition, deadline, what):
            time.sleep(0.05)

    async def until(self, condition, timeout: float, what: str) -> None:
        """Wait until ``condition()`` while the test's adversary runs on the event loop."""
        deadline = time.monotonic() + timeout
        while not self._settled(condition, deadline, what):
            await asyncio.sleep(0.05)

    def _settled(self, condition, deadline: float, what: str) -> bool:
        """Whether ``condition()`` holds; fails with the logs if a process died or time ran out."""
        if condition():
            return True
        dead = [p.name for p in self.processes() if not p.alive]
        if dead or time.monotonic() > deadline:
            raise AssertionError(f"{what}: {'died: ' + ', '.join(dead) if dead else 'timed out'}\n"
                                 + "\n".join(f"--- {p.name}\n{p.tail(1500)}" for p in self.processes()))
        return False

    def processes(self) -> list[Process]:
        return [p for p in [self.backbone, *self.peers] if p is not None]

    # --- what happened -------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return max((p.epoch for p in self.peers), default=0)

    def arrival(self, epoch: int) -> float:
        """When the first honest peer's line of ``epoch`` came: stamped by its reader thread,
        so an adversary busy on the test's event loop does not move it."""
        return min(t for p in self.peers for e, t in zip(p.epochs, p.arrivals, strict=False)
                   if e["epoch"] == epoch)

    def hashes(self, epoch: int) -> dict[str, str]:
        return {p.name: e["state_sha256"] for p in self.peers for e in p.epochs if e["epoch"] == epoch}

    def db(self) -> sqlite3.Connection:
        path = self.root / "backbone" / "backbone.sqlite3"
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)

    def credited(self, peer_ids: list[str]) -> int:
        """Samples the ledger credits to these peers (and has not withdrawn)."""
        return self._ledger_sum("samples", peer_ids)

    def aggregated(self, peer_ids: list[str]) -> int:
        """Bytes aggregated the ledger credits to these peers (as auxiliary peers)."""
        return self._ledger_sum("aggregated_bytes", peer_ids)

    def _ledger_sum(self, column: str, peer_ids: list[str]) -> int:
        if not peer_ids:
            return 0
        with self.db() as db:
            marks = ",".join("?" * len(peer_ids))
            query = (f"SELECT COALESCE(SUM({column}), 0) FROM contributions WHERE peer_id IN ({marks}) "
                     "AND withdrawn_at IS NULL")
            row = db.execute(query, peer_ids).fetchone()
        return int(row[0])

    def recorded(self) -> dict[int, tuple[float | None, str]]:
        """epoch -> (loss, state hash) of every step the backbone recorded."""
        with self.db() as db:
            rows = db.execute("SELECT epoch, loss, state_sha256 FROM steps WHERE project=?",
                              (self.project.id,)).fetchall()
        return {epoch: (loss, digest) for epoch, loss, digest in rows}

    def rss(self) -> dict[str, int]:
        return {p.name: p.rss() for p in self.processes()}

    def checkpoint_loss(self, epoch: int, batches: int = 16) -> float:
        """The loss of the backbone's checkpoint of ``epoch`` on batches no peer trained on (not
        what members report: a poisoner's parts carry a made-up loss)."""
        path = self.checkpoint_file(epoch)
        assert path is not None, f"no checkpoint of epoch {epoch}"
        spec = self.project
        task = create_task(spec.task, dict(spec.task_params))
        model = initial_model(task, spec.seed)
        optimizer = collaboration_optimizer(spec, model)
        warm = warm_slots(optimizer, trainable(model), warm_shapes_of(spec, trainable(model)))
        load_state(decode_file(path.read_bytes()), model, optimizer, spec.id, warm)
        with torch.no_grad():
            return statistics.mean(float(task.loss(model, task.batch(10**6, i))) for i in range(batches))

    def initial_gradient(self) -> torch.Tensor:
        """A flat per-sample gradient of the project's initial model, as anyone can compute it
        from the project's spec: what an attacker's parts look like before it knows better.
        In local mode, the per-sample pseudo-gradient of one peer's share of an outer step."""
        spec = self.project
        task = create_task(spec.task, dict(spec.task_params))
        model = initial_model(task, spec.seed)
        if spec.mode == "local":
            return self._initial_pseudo_gradient(task, model)
        task.loss(model, task.batch(10**7, 0)).backward()
        return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])

    def _initial_pseudo_gradient(self, task, model: torch.nn.Module) -> torch.Tensor:
        spec = self.project
        inner = partial(build_optimizer, spec.optimizer)
        local = LocalSteps(spec.local, inner, spec.optimizer.clip_grad_norm)
        copy = local.place(model, None, {})
        accumulator = GradientAccumulator(trainable(copy))
        lr = lr_at(spec.schedule, spec.optimizer.lr, 0)
        share = spec.target_batch_size // len(self.names)  # one peer's samples per outer step
        while accumulator.samples < share:
            batch = task.batch(10**7, len(accumulator.batches))
            (task.loss(copy, batch) * batch.size).backward()
            accumulator.add(batch.size, 0.0, len(accumulator.batches))
            local.after_micro_batch(batch.size, lr)
        taken = local.take(model, accumulator, lr)
        return taken.vector / taken.samples

    def checkpoint_file(self, epoch: int) -> Path | None:
        """The backbone's file of its checkpoint of ``epoch``, as its records name it."""
        return self._checkpoint_files(epoch, epoch).get(epoch)

    def has_checkpoint(self, epoch: int) -> bool:
        return self.checkpoint_file(epoch) is not None

    def first_checkpoint(self, since: int) -> int | None:
        """The first epoch from ``since`` on that the backbone holds a checkpoint of: a chore
        whose peer left or failed goes to the next round's (the checkpoint is an epoch late)."""
        return min(self._checkpoint_files(since, None), default=None)

    def _checkpoint_files(self, first: int, last: int | None) -> dict[int, Path]:
        """The checkpoints' files the backbone holds of epochs ``first`` to ``last``, by epoch."""
        data = self.root / "backbone"
        if not (data / "backbone.sqlite3").exists():
            return {}
        with contextlib.closing(sqlite3.connect(f"file:{data / 'backbone.sqlite3'}?mode=ro", uri=True)) as db:
            upto = last if last is not None else 2**62
            query = "SELECT epoch, sha256 FROM checkpoints WHERE project=? AND epoch BETWEEN ? AND ?"
            rows = db.execute(query, (self.project.id, first, upto)).fetchall()
        files = CheckpointFiles(data / "checkpoints")
        found = {epoch: files.path(sha) for epoch, sha in rows}
        return {epoch: path for epoch, path in found.items() if path is not None and path.exists()}


@contextlib.contextmanager
def running(root: Path, **options) -> Iterator[Collaboration]:
    """A started collaboration (backbone and honest peers at work), stopped on the way out."""
    collaboration = Collaboration(root, **options)
    try:
        collaboration.start()
        yield collaboration
    finally:
        collaboration.stop()
