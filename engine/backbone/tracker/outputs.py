"""What the tracker decides, for the server to carry out: the tracker itself sends nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.backbone.ledger import Credit
from engine.wire.control import ControlMessage, Step


@dataclass
class Send:
    to: str
    msg: ControlMessage


@dataclass
class Broadcast:
    msg: ControlMessage


@dataclass
class Record:
    """Store a step the collaboration took, and what each member is credited for it."""

    step: Step
    credits: dict[str, Credit] = field(default_factory=dict)


@dataclass
class CollaborationState:
    """The epoch and parameters the collaboration continues from changed without a step
    (a rewind to a checkpoint, a fresh start, or a step adopted after a crash)."""

    epoch: int
    params_sha256: str | None


Out = Send | Broadcast | Record | CollaborationState
