"""Field types shared by every message: each bound is stated once, and checked whenever
untrusted bytes are decoded (msgspec does not check them when we build a message)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import Enum
from typing import Annotated

from msgspec import Meta

# Integers stay well inside SQLite's and JSON's safe ranges; floats are finite (JSON has no
# NaN, and a number beyond these bounds is refused rather than turned into infinity).
MAX_COUNT = 10**15
MAX_RATE = 1e15
MAX_SECONDS = 1e12
Count = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
EpochNumber = Annotated[int, Meta(ge=0, le=10**12)]
RoundId = Annotated[int, Meta(ge=0, le=2**62)]
Nonce = Annotated[int, Meta(ge=0, le=2**62)]
Seconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
Rate = Annotated[float, Meta(ge=0, le=MAX_RATE)]
Loss = Annotated[float, Meta(ge=-1e30, le=1e30)]
Share = Annotated[float, Meta(ge=0, le=1e9)]

PeerId = Annotated[str, Meta(min_length=1, max_length=64)]
Sha256 = Annotated[str, Meta(pattern="^[0-9a-f]{64}$")]
ProjectId = Annotated[str, Meta(pattern="^[a-z0-9][a-z0-9-]{0,62}$")]
Name = Annotated[str, Meta(max_length=64)]
Text = Annotated[str, Meta(max_length=4096)]
Url = Annotated[str, Meta(max_length=2048)]
MAX_GROUP = 10_000  # peers in one round, and parts of one


def total_count(counts: Iterable[int]) -> int:
    """A sum of counts that is a count itself: ten thousand valid counts add up past
    MAX_COUNT, and a sum a stranger's claims made too large must not make the message that
    carries it invalid for everyone else. It saturates instead."""
    return min(sum(counts), MAX_COUNT)


def total_rate(rates: Iterable[float]) -> float:
    return min(math.fsum(rates), MAX_RATE)
MAX_PIECES = 8  # parts per member's share


class StrEnum(str, Enum):
    """Python 3.11's StrEnum, on 3.10 too: members are strings and print as their value."""

    def __str__(self) -> str:
        return str(self.value)


class StateSource(StrEnum):
    """Where a peer gets the collaboration's state."""

    INIT = "init"  # a fresh model from the project's seed (nobody holds any state yet)
    PEER = "peer"  # a live peer, over WebRTC
    CHECKPOINT = "checkpoint"  # the backbone's latest checkpoint, over HTTP


class IcePolicy(StrEnum):
    ALL = "all"  # direct where possible
    RELAY = "relay"  # through TURN only


class LinkPath(StrEnum):
    """How a link connects, in order of indirection."""

    HOST = "host"  # direct, on one network
    SRFLX = "srflx"  # through a NAT's mapping (STUN)
    RELAY = "relay"  # through TURN

    @property
    def rank(self) -> int:
        return list(LinkPath).index(self)


class PeerRole(StrEnum):
    """What a peer brings to a collaboration."""

    TRAINER = "trainer"  # computes gradients, reduces a part of each round, applies every step
    AUXILIARY = "aux"  # no training: reduces parts only (a machine with bandwidth but no useful compute)


class Transport(StrEnum):
    """A WebRTC stack a link may run on (engine/transport/backends/)."""

    NATIVE = "native"  # libwebrtc, through wrtc
    AIORTC = "aiortc"  # pure Python: everywhere, and slower


class SignalKind(StrEnum):
    OFFER = "offer"
    ANSWER = "answer"
