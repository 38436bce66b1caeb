"""What a running peer tells its front end (the CLI, the demo, the desktop app's worker).

``EpochCompleted`` is also the worker protocol's ``epoch`` event: the app is told of a step
in the very shape the peer saw it.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct, field

from engine.project import ProjectSpec
from engine.transport.counters import LinkCounters
from engine.wire.control import Status, Step
from engine.wire.types import MAX_GROUP, Count, EpochNumber, LinkPath, PeerId, Seconds


class Joined(Struct):
    peer_id: PeerId
    project: ProjectSpec
    username: str | None = None


class Connection(Struct):
    """The control connection to the backbone was lost or is back."""

    connected: bool
    message: str


class Governed(Struct):
    """The governor let the peer compute, or paused it; ``reason`` is for people."""

    running: bool
    reason: str


class ComputingOn(Struct):
    """Where micro-batches run (the CPU or a graphics card), in words for people."""

    description: str


class SyncProgress(Struct):
    """Downloading the collaboration's state: ``received`` of ``total`` bytes."""

    source: str
    received: int
    total: int


class FileProgress(Struct):
    """Downloading one of the project's files (a shard, the tokenizer)."""

    path: str
    received: int
    total: int


class Synced(Struct):
    epoch: int
    source: str
    state_sha256: str


class EpochCompleted(Struct, tag_field="type", tag="epoch", kw_only=True):
    """A global step this peer took part in, and its own share of it."""

    step: Step
    my_samples: Count
    my_batches: Annotated[list[int], Meta(max_length=10**6)] = field(default_factory=list)
    # The epoch of the state those were computed on: the step's own in sync rounds, the one
    # before it in overlapped rounds (None: both, after a failed round gave its gradient back).
    computed_on: int | None = None
    paths: Annotated[dict[PeerId, LinkPath | None], Meta(max_length=MAX_GROUP)] = \
        field(default_factory=dict)  # peer -> how its link connects
    # This peer's own time in the round: averaging, then applying the step (the step's
    # round_seconds is the backbone's, from opening the round to settling it), and when
    # (UNIX time) it began, its gradient in hand: the round's members together ran from the
    # last of them to begin to the last to finish.
    averaging_seconds: Seconds = 0.0
    averaging_began: Seconds = 0.0
    # From the RoundStart to our gradient in hand (the micro-batch under way finished), and to
    # our first part on its link (None: we sent none): how much of a round is set-up.
    took_seconds: Seconds = 0.0
    first_byte_seconds: Seconds | None = None


class Aggregated(Struct, tag_field="type", tag="aggregated", kw_only=True):
    """A round in which this auxiliary peer reduced parts for the others."""

    round_id: int
    epoch: EpochNumber
    parts: Count  # how many parts it reduced (its own, and any it took over)
    senders: Count  # whose parts it combined
    bytes_in: Count  # bytes of the parts it took in
    seconds: Seconds


class RoundFailed(Struct):
    epoch: EpochNumber
    reason: str


class StatusChanged(Struct):
    status: Status
    traffic: LinkCounters


class Stopped(Struct):
    reason: str


PeerEvent = (Joined | Connection | Governed | ComputingOn | SyncProgress | FileProgress | Synced
             | EpochCompleted | Aggregated | RoundFailed | StatusChanged | Stopped)
