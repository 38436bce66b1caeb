"""A real backbone on loopback and in-process peers, for multi-peer tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.backbone.server import Backbone, BackboneConfig
from engine.peer.events import EpochCompleted, PeerEvent, Synced, SyncProgress
from engine.peer.options import PeerOptions
from engine.peer.runner import Peer
from engine.project import OptimizerSpec, ProjectSpec, ScheduleSpec
from tests.conftest import until

TINY = dict(d_model=32, heads=2, ff=64, layers=2, embedding=16, seq_len=16, micro_batch=4)
# Big enough that compute, not bookkeeping, sets a peer's pace.
MEDIUM = dict(TINY, d_model=96, heads=4, ff=384, layers=3, seq_len=32, micro_batch=8)


def tiny_project(**overrides) -> ProjectSpec:
    spec = dict(
        id="tiny-lm", title="Tiny LM", task="demo-lm", task_params=dict(TINY),
        target_batch_size=48, optimizer=OptimizerSpec(name="adamw", lr=1e-2, clip_grad_norm=1.0),
        schedule=ScheduleSpec(type="linear", warmup_epochs=1, total_epochs=50), seed=7,
        round_timeout=20, checkpoint_every=1000,
    )
    spec.update(overrides)
    return ProjectSpec(**spec)


@contextlib.asynccontextmanager
async def running_backbone(data_dir: Path, *projects: ProjectSpec, **config):
    backbone = Backbone(BackboneConfig(data_dir=data_dir, **config), list(projects))
    await backbone.start()
    try:
        yield backbone
    finally:
        await backbone.stop()


@dataclass
class RunningPeer:
    peer: Peer
    task: asyncio.Task
    events: list[PeerEvent] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each event arrived (monotonic)

    @property
    def history(self) -> list[EpochCompleted]:
        return self.peer.history

    @property
    def epoch(self) -> int:
        """The epoch of its last step (0 before any)."""
        return self.history[-1].step.epoch if self.history else 0

    async def reached(self, epoch: int, timeout: float) -> None:
        await until(lambda: self.epoch >= epoch or self.task.done(),
                    timeout, f"{self.peer.options.name} to reach epoch {epoch}")
        if self.task.done() and not self.epoch >= epoch:
            raise AssertionError(f"{self.peer.options.name} stopped early: {self.task.result()}")

    def synced(self) -> list[Synced]:
        return [e for e in self.events if isinstance(e, Synced)]

    def sync_progress(self) -> list[SyncProgress]:
        return [e for e in self.events if isinstance(e, SyncProgress)]

    async def finish(self, timeout: float = 60) -> str:
        return await asyncio.wait_for(self.task, timeout)


def start_peer(url: str, project: str, name: str, **options) -> RunningPeer:
    events: list[PeerEvent] = []
    times: list[float] = []

    def record(event: PeerEvent) -> None:
        events.append(event)
        times.append(time.monotonic())

    peer = Peer(PeerOptions(backbone_url=url, project_id=project, name=name, **options), record)
    return RunningPeer(peer, asyncio.ensure_future(peer.run()), events, times)


async def stop_all(*peers: RunningPeer) -> None:
    for p in peers:
        p.peer.stop()
    await asyncio.gather(*(p.task for p in peers), return_exceptions=True)
