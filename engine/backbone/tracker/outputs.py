"""What the tracker decides, for the server to carry out: the tracker itself sends nothing."""

from __future__ import annotations

from dataclasses import dataclass

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
class RoundOpened:
    """Keep whose reports settle a round: after a restart, it settles on what a majority of
    these members replay, never on what one peer says."""

    round_id: int
    epoch: int
    voters: list[str]


@dataclass
class RecordStep:
    """Store a step the collaboration settled on."""

    step: Step


@dataclass
class RecordCredits:
    """Store what each member of a settled round is credited for it."""

    round_id: int
    credits: dict[str, Credit]


@dataclass
class WithdrawCredits:
    """A reducer was caught returning a wrong result: the credit it was given for these
    rounds (those it reduced in since a part of it last passed a check) is withdrawn."""

    peer_id: str
    round_ids: list[int]
    why: str


@dataclass
class RecordHeldOut:
    """Store the held-out metric of an epoch's state (replacing what was stored for it)."""

    epoch: int
    loss: float
    accuracy: float | None
    scores: int


@dataclass
class CollaborationState:
    """The epoch and state the collaboration continues from changed without a step (a
    rewind to a checkpoint, or a fresh start)."""

    epoch: int
    state_sha256: str | None


Out = (Send | Broadcast | RoundOpened | RecordStep | RecordCredits | WithdrawCredits | RecordHeldOut
       | CollaborationState)
