"""What a running peer tells its front end (the CLI, the demo, the desktop app's worker)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.project import ProjectSpec
from engine.training.optimizer import EpochResult
from engine.transport.link import LinkCounters
from engine.wire.messages import Status


@dataclass
class Joined:
    peer_id: str
    project: ProjectSpec
    username: str | None = None


@dataclass
class Connection:
    """The control connection to the backbone was lost or is back."""

    connected: bool
    message: str


@dataclass
class Governed:
    """The governor let the peer compute, or paused it; ``reason`` is for people."""

    running: bool
    reason: str


@dataclass
class ComputingOn:
    """Where micro-batches run (the CPU or a graphics card), in words for people."""

    description: str


@dataclass
class SyncProgress:
    """Downloading the collaboration's state: ``received`` of ``total`` bytes."""

    source: str
    received: int
    total: int


@dataclass
class Synced:
    epoch: int
    source: str
    params_sha256: str


@dataclass
class EpochCompleted:
    result: EpochResult
    paths: dict[str, str | None] = field(default_factory=dict)  # peer -> host, srflx or relay


@dataclass
class RoundFailed:
    epoch: int
    reason: str


@dataclass
class StatusChanged:
    status: Status
    traffic: LinkCounters


@dataclass
class Stopped:
    reason: str


Event = (Joined | Connection | Governed | ComputingOn | SyncProgress | Synced | EpochCompleted
         | RoundFailed | StatusChanged | Stopped)
