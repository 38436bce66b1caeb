"""The control plane: JSON text messages between a peer and the backbone over one WebSocket.

``{"type": ..., ..., "v": 2}``: each message kind is a Struct tagged by ``type``; peers may
send only ``PeerMessage``s and the backbone only ``BackboneMessage``s, so a message of the
wrong direction is refused while it is decoded.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from engine.wire import WIRE_VERSION
from engine.wire.codec import Codec
from engine.wire.commitments import Commitment, Committed, Digests
from engine.wire.groups import RoundGroups
from engine.wire.ice_servers import IceServerList
from engine.wire.types import (
    MAX_GROUP,
    MAX_PIECES,
    Count,
    EpochNumber,
    Loss,
    Nonce,
    PeerId,
    Rate,
    RoundId,
    Seconds,
    Sha256,
    Share,
    SignalKind,
    StateSource,
    Text,
    Transport,
    Url,
)

MAX_CONTROL_MESSAGE = 256 * 1024
MAX_SDP = 32 * 1024
SampleCounts = Annotated[dict[PeerId, Count], Meta(max_length=MAX_GROUP)]
PeerList = Annotated[list[PeerId], Meta(max_length=MAX_GROUP)]


class ControlMessage(Struct, tag_field="type", kw_only=True):
    v: Literal[10] = WIRE_VERSION


def version_mismatch(peer: int, backbone: int) -> str:
    """Why a peer and a backbone of different releases cannot work together, and who must
    update: phrased the same on both ends."""
    if peer < backbone:
        return f"please update Cotrain (wire v{peer}, backbone speaks v{backbone})"
    return (f"the backbone runs an older Cotrain (wire v{peer}, backbone speaks v{backbone}): "
            "its owner must update it")


# --- peer -> backbone ---------------------------------------------------------------------


class Progress(ControlMessage, tag="progress"):
    """What a peer has accumulated towards the current epoch's target batch."""

    epoch: EpochNumber
    samples: Count
    samples_per_second: Rate
    loss: Loss | None = None
    compute_seconds: Seconds = 0.0
    client_mode: bool = False  # reachable only through a relay: send parts, reduce none
    upload: Rate | None = None  # bytes per second the peer's link achieves (engine/peer/bandwidth.py)
    download: Rate | None = None
    # This count may reach the target: the peer computes nothing more until the answer (the
    # round's start, a Resync or else a Status; once per count) or ``report_interval``
    # (engine/peer/progress.py).
    asks_status: bool = False


class Evaluated(ControlMessage, tag="evaluated"):
    """The project's held-out set, scored on the state of ``epoch`` (the one it names): the
    mean loss, and for a classifier the share classified right, over ``samples``."""

    epoch: EpochNumber
    state_sha256: Sha256
    loss: Loss
    samples: Count
    accuracy: Annotated[float, Meta(ge=0, le=1)] | None = None


class SyncRequest(ControlMessage, tag="sync_request"):
    """Asks where to get the collaboration's current state from (not from ``exclude``)."""

    exclude: PeerList = field(default_factory=list)


class Ready(ControlMessage, tag="ready"):
    """The peer holds the state of ``epoch`` and may be put in rounds."""

    epoch: EpochNumber
    state_sha256: Sha256


class RoundDone(ControlMessage, tag="round_done"):
    """Outcome of one averaging round on one peer: the hash of the state its step produced
    (the round settles on the hash a majority reports), and, as a reducer, the samples each
    sender's part carried (credit is what a majority of reducers saw)."""

    round_id: RoundId
    epoch: EpochNumber
    ok: bool
    state_sha256: Sha256 | None = None
    samples: Count = 0
    loss: Loss | None = None
    seconds: Seconds = 0.0
    error: Text | None = None
    received: SampleCounts = field(default_factory=dict)  # sender -> samples in its part to me
    unreachable: PeerList = field(default_factory=list)  # peers it could not exchange with
    # Reducers whose results had not come when it failed: not evidence that the pair cannot
    # exchange (the reducer may wait on someone else), but a majority's word against an
    # auxiliary peer that withholds its results.
    waiting: PeerList = field(default_factory=list)
    commitment: Commitment | None = None  # in projects whose reducers are checked
    numel: Count = 0  # length of the averaged vector: sizes an auxiliary peer's credit
    # PowerSGD: the length of the vector each all-reduce phase moved (P, then Q): part j of
    # phase k is part ``k * parts + j`` of the commitment, the draw and the credit. Empty:
    # one phase, of ``numel``.
    phase_numel: Annotated[list[Count], Meta(max_length=2)] = field(default_factory=list)
    # Proof that it holds the state it reports: a hash of the round's nonce and of values of
    # that state the nonce picks (engine/training/params.state_proof). The state's own hash
    # is broadcast with every step, so a peer that holds nothing could echo it; not this.
    proof: Sha256 | None = None


class AuditDone(ControlMessage, tag="audit_done"):
    """A checker's verdict on a reducer's part: whether the parts the reducer sent it match
    what the reducer committed, and combine into the result everyone applied."""

    round_id: RoundId
    index: Annotated[int, Meta(ge=0, lt=MAX_GROUP)]
    ok: bool
    result_sha256: Sha256 | None = None  # what the checker computed
    reason: Text | None = None
    # The reducer never showed its inputs (not ok, but no verdict on its result).
    unanswered: bool = False


class SignalData(Struct, kw_only=True):
    """One step of WebRTC's offer/answer; ``conn`` names the connection attempt."""

    kind: SignalKind
    conn: Annotated[str, Meta(max_length=64)]
    sdp: Annotated[str, Meta(max_length=MAX_SDP)]
    # The stack this side made ``sdp`` with, and every stack it has: the answerer takes the
    # offer's when it has it, so a pair runs native only when both ends can.
    transport: Transport = Transport.AIORTC
    transports: Annotated[list[Transport], Meta(max_length=8)] = field(
        default_factory=lambda: [Transport.AIORTC])


class Signal(ControlMessage, tag="signal"):
    """WebRTC signaling relayed by the backbone; ``peer`` is the other end."""

    peer: PeerId
    data: SignalData


class Availability(ControlMessage, tag="availability"):
    """The peer's owner paused it (or let it run again): leave it out of rounds meanwhile."""

    paused: bool


class BadState(ControlMessage, tag="bad_state"):
    """The state ``peer`` served did not check out (wrong hash, shapes, values, size)."""

    peer: PeerId
    reason: Text


class Ping(ControlMessage, tag="ping"):
    """Asks the backbone for an immediate Pong: how long a message takes to be handled."""

    nonce: Nonce


# --- backbone -> peer ---------------------------------------------------------------------


class Pong(ControlMessage, tag="pong"):
    nonce: Nonce


class CheckpointInfo(Struct):
    """A stored checkpoint: the state file of ``epoch``, served at ``url``."""

    epoch: EpochNumber
    sha256: Sha256
    state_sha256: Sha256
    size: Count
    url: Url


class SyncPlan(ControlMessage, tag="sync_plan"):
    """Where a peer gets its state."""

    epoch: EpochNumber
    source: StateSource
    peer: PeerId | None = None
    checkpoint: CheckpointInfo | None = None
    state_sha256: Sha256 | None = None


# An auxiliary member gives up on a round at this share of its timeout, and reports whose
# parts it missed, before the trainers give up on its results and name it.
AUXILIARY_DEADLINE = 0.8


class RoundStart(ControlMessage, tag="round_start"):
    """Opens an averaging round: who is in it and which part of the vector each reduces."""

    round_id: RoundId
    epoch: EpochNumber
    group: Annotated[list[PeerId], Meta(min_length=1, max_length=MAX_GROUP)]
    shares: Annotated[list[Share], Meta(min_length=1, max_length=MAX_GROUP)]
    timeout: Annotated[float, Meta(gt=0, le=86400)]
    checkpoint_by: PeerId | None = None
    # Members on probation (newcomers, or after a missed round): their parts are taken if
    # they come in time, never waited for; they reduce nothing.
    optional: Annotated[list[PeerId], Meta(max_length=MAX_GROUP)] = field(default_factory=list)
    # Auxiliary peers: they reduce their part and bring no gradient, so nobody waits for a
    # part from them, nor sends them results, and they take no step.
    auxiliary: Annotated[list[PeerId], Meta(max_length=MAX_GROUP)] = field(default_factory=list)
    # Each member's share comes in this many parts (planning/partition.py): part j is
    # member j // pieces's to reduce, and its result goes out while later pieces come in.
    pieces: Annotated[int, Meta(ge=1, le=MAX_PIECES)] = 1
    # Per member, the most samples its parts may count for: what the backbone saw it compute
    # towards this round (engine/backbone/tracker/membership.py). Empty: no caps.
    caps: Annotated[list[Count], Meta(max_length=MAX_GROUP)] = field(default_factory=list)
    # What members prove they hold the state with (RoundDone.proof): fresh for every round.
    nonce: Sha256 | None = None
    # A round of many members runs in groups; then ``shares`` is each slot reducer's slot share.
    groups: RoundGroups | None = None

    def __post_init__(self) -> None:
        if len(self.group) != len(self.shares):
            raise ValueError("group and shares must be of equal length")
        if self.caps and len(self.caps) != len(self.group):
            raise ValueError("caps, if given, are one per member")
        if len(set(self.group)) != len(self.group):
            raise ValueError("group lists a peer twice")
        if sum(self.shares) <= 0:
            raise ValueError("shares must have a positive sum")
        if not set(self.optional) <= set(self.group) or len(set(self.optional)) >= len(self.group):
            raise ValueError("optional members must be some, not all, of the group")
        optional = set(self.optional)
        if any(share > 0 for peer, share in zip(self.group, self.shares, strict=True) if peer in optional):
            raise ValueError("optional members reduce nothing")
        auxiliary = set(self.auxiliary)
        if not auxiliary <= set(self.group) - optional or len(auxiliary) != len(self.auxiliary):
            raise ValueError("auxiliary members must be listed once, in the group and not optional")
        if len(auxiliary) >= len(self.group):
            raise ValueError("a round needs a member that brings a gradient")
        if len(self.group) * self.pieces > MAX_GROUP:
            raise ValueError(f"a round has at most {MAX_GROUP} parts")
        if self.groups is not None:
            members = [p for g in self.groups.groups for p in g]
            if sorted(members) != sorted(self.group) or self.pieces != 1:
                raise ValueError("a grouped round's groups hold each member once, in one piece")
            reducers = {r for g in self.groups.reducers for r in g}
            if not auxiliary <= reducers:
                raise ValueError("an auxiliary member of a grouped round reduces a slot")


class Reassign(ControlMessage, tag="reassign"):
    """Members of round ``round_id`` left it midway (their control socket closed or went
    silent): stop waiting for anything from ``lost``, and from now on send part j to
    ``reducers[j]`` and take its result from there (one entry per part, not per member). A
    lost reducer's parts go to a backup; every member keeps its own parts until the round
    ends, so only those are sent again."""

    round_id: RoundId
    epoch: EpochNumber
    lost: Annotated[list[PeerId], Meta(min_length=1, max_length=MAX_GROUP)]
    reducers: Annotated[list[PeerId], Meta(min_length=1, max_length=MAX_GROUP)]


class Step(ControlMessage, tag="epoch"):
    """A global step the collaboration took: the one record of an epoch finished, broadcast
    to peers, stored by the backbone and kept in each peer's history. ``epoch`` counts
    steps, this one included."""

    epoch: EpochNumber
    round_id: RoundId
    loss: Loss | None
    samples: Count
    peers: Count
    round_seconds: Seconds
    state_sha256: Sha256


class Audit(ControlMessage, tag="audit"):
    """Check part ``index`` of a round that has not settled yet, drawn at random after
    every member committed: sent to its reducer (send the parts you combined to
    ``checker``) and to the checker (combine them as the project says; the result must
    hash to ``result_sha256``, which the members applied)."""

    round_id: RoundId
    epoch: EpochNumber
    index: Annotated[int, Meta(ge=0, lt=MAX_GROUP)]
    reducer: PeerId
    checker: PeerId
    inputs: Annotated[list[Committed], Meta(max_length=MAX_GROUP)]
    result_sha256: Sha256
    timeout: Annotated[float, Meta(gt=0, le=86400)]
    # The most samples each input counts for, in the order of ``inputs`` (RoundStart.caps).
    caps: Annotated[list[Count], Meta(max_length=MAX_GROUP)] = field(default_factory=list)
    # A grouped round's level-1 part: nobody applies its result, the group's average; its
    # reducer sent it on, times the group's samples, as its level-2 parts, which hash to
    # ``forwarded`` (its commitment), one per piece of the slot (``pieces``: their shares).
    forwarded: Digests = field(default_factory=list)
    pieces: Annotated[list[Share], Meta(max_length=MAX_GROUP)] = field(default_factory=list)
    # A grouped round's level-2 part: its inputs are groups' sums, which no share of the
    # target batch bounds (aggregation.max_sample_share: that bounds one sender).
    group_sums: bool = False
    # Whether the reducer judged its inputs by its own part (robust.aggregate's reference):
    # an auxiliary reducer beside one proven trainer takes what comes.
    judged: bool = True

    def __post_init__(self) -> None:
        if self.caps and len(self.caps) != len(self.inputs):
            raise ValueError("caps, if given, are one per input")
        if len(self.forwarded) != len(self.pieces) or (self.pieces and sum(self.pieces) <= 0):
            raise ValueError("forwarded parts are one per piece, of shares with a positive sum")


class Resync(ControlMessage, tag="resync"):
    """Your state is not the collaboration's: get the settled state of ``epoch`` again (a
    peer that kept it, from before a step that did not settle, restores it at once)."""

    epoch: EpochNumber
    reason: Text
    state_sha256: Sha256 | None = None


class Status(ControlMessage, tag="status"):
    """Collaboration progress: broadcast about once a second, sent to a peer when it is ready
    and in answer to a report that asks. ``samples`` count toward the target: proven peers'
    (everyone's while none is). A newcomer on probation (not ``counts_you``) brings one
    micro-batch to the first round, which proves it, not a batch on top of the target."""

    epoch: EpochNumber
    samples: Count
    target: Count
    peers: Count
    samples_per_second: Rate
    eta_seconds: Seconds | None = None
    counts_you: bool = True
    # How old the counts are (in an answer, the others'), and the counted peers' pace as the
    # backbone timed it (not over wall time): they computed about the two multiplied since.
    counts_age: Seconds = 0.0
    pace: Rate = 0.0


MAX_PARTNERS = 100  # half a peer's connections: warming never crowds out links in use


class Partners(ControlMessage, tag="partners"):
    """The members a peer that just became ready will average with: it links to them now,
    so its first round need not wait for links to be set up."""

    peers: Annotated[list[PeerId], Meta(max_length=MAX_PARTNERS)]


class IceServers(ControlMessage, tag="ice_servers"):
    """Fresh STUN/TURN servers for the links set up from now on: TURN credentials expire,
    so the backbone sends new ones when the control socket connects and before they do."""

    servers: IceServerList


PeerMessage = (Progress | SyncRequest | Ready | RoundDone | AuditDone | Signal | Availability | BadState
               | Evaluated | Ping)
BackboneMessage = (Pong | SyncPlan | RoundStart | Reassign | Step | Audit | Resync | Status | Signal
                   | IceServers | Partners)

from_peer: Codec[PeerMessage] = Codec(
    PeerMessage, "control message", MAX_CONTROL_MESSAGE, WIRE_VERSION,
    lambda theirs: version_mismatch(peer=theirs, backbone=WIRE_VERSION))
from_backbone: Codec[BackboneMessage] = Codec(
    BackboneMessage, "message from the backbone", MAX_CONTROL_MESSAGE, WIRE_VERSION,
    lambda theirs: version_mismatch(peer=WIRE_VERSION, backbone=theirs))
