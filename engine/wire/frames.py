"""Headers of the data plane's frames between peers (see framing.py for the chunks).

Each frame is one of these headers plus a payload of raw bytes; the header is decoded and
checked as soon as a frame's first chunk arrives, so a peer that sends a malformed header
loses its link before anything is decided about anyone else.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct, field

from engine.wire.codec import Codec
from engine.wire.control import SampleCounts
from engine.wire.types import Count, EpochNumber, LinkPath, Loss, PeerId, RoundId, Sha256, Text

MAX_HEADER = 64 * 1024
RequestId = Annotated[int, Meta(ge=0, le=2**62)]
PartIndex = Annotated[int, Meta(ge=0, le=10_000)]
TensorDtype = Literal["float32"]


class FrameHeader(Struct, tag_field="type", kw_only=True):
    pass


class Part(FrameHeader, tag="part"):
    """A sender's slice of its accumulated gradient sum, for the slice's reducer."""

    round_id: RoundId
    epoch: EpochNumber
    index: PartIndex
    samples: Count
    loss_sum: Loss
    dtype: TensorDtype = "float32"


class Result(FrameHeader, tag="result"):
    """A reducer's averaged slice, the same bytes for every peer of the round."""

    round_id: RoundId
    epoch: EpochNumber
    index: PartIndex
    samples: Count
    loss: Loss | None
    dtype: TensorDtype = "float32"
    received: SampleCounts = field(default_factory=dict)  # sender -> samples in the parts reduced


class Shown(FrameHeader, tag="shown"):
    """A reducer's own part ``index``, committed by its hash (``averaging/audit.part_digest``)
    before it takes anyone else's: in a project that checks reducers, a sender sends its part
    only once its reducer has shown this, and commits to what it was shown."""

    round_id: RoundId
    epoch: EpochNumber
    index: PartIndex
    sha256: Sha256


class Input(FrameHeader, tag="input"):
    """A part a reducer combined, sent to the peer the backbone asked to check it."""

    round_id: RoundId
    epoch: EpochNumber
    index: PartIndex  # the part checked
    position: PartIndex  # the input's place in the audit's list
    sender: PeerId
    samples: Count
    dtype: TensorDtype = "float32"


class StateRequest(FrameHeader, tag="state_request"):
    request_id: RequestId


class StateReply(FrameHeader, tag="state"):
    """Training state; the payload is a state file (see engine.wire.tensors)."""

    request_id: RequestId
    epoch: EpochNumber
    state_sha256: Sha256


class StateUnavailable(FrameHeader, tag="state_unavailable"):
    request_id: RequestId
    reason: Text


class Goodbye(FrameHeader, tag="goodbye"):
    """The sender closes the link once this is acknowledged: everything before it arrived."""


class GoodbyeAck(FrameHeader, tag="goodbye_ack"):
    pass


class PathView(FrameHeader, tag="path"):
    """How the sender sees the connection (None before ICE has chosen a pair)."""

    view: LinkPath | None


class ReceiveLimit(FrameHeader, tag="receive_limit"):
    """The sender asks to be sent at most this many bytes per second (None: no limit)."""

    bytes_per_second: Annotated[float, Meta(ge=0, le=1e13)] | None


Header = (Part | Result | Shown | Input | StateRequest | StateReply | StateUnavailable | Goodbye | GoodbyeAck
          | PathView | ReceiveLimit)
StateFrame = StateRequest | StateReply | StateUnavailable

headers: Codec[Header] = Codec(Header, "frame header", MAX_HEADER)
