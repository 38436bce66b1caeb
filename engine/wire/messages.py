"""Message types of the control plane (peer <-> backbone, JSON over WebSocket) and the
headers of the data plane (peer <-> peer frames over WebRTC).

Each message is a dataclass with a ``TYPE``; ``encode`` adds the wire version and
``decode`` validates an untrusted dict into the right class or raises ProtocolError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.wire import WIRE_VERSION, ProtocolError
from engine.wire.schema import from_dict, to_dict

MAX_CONTROL_MESSAGE = 256 * 1024


def _non_negative(**values: float) -> None:
    for name, value in values.items():
        if value < 0:
            raise ValueError(f"{name} must not be negative")


def _sample_counts(name: str, counts: dict) -> None:
    """A peer id -> samples map, as reducers confirm what they received."""
    if len(counts) > 10_000:
        raise ValueError(f"{name} lists too many peers")
    for peer, samples in counts.items():
        if len(peer) > 64 or isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"{name} must map peer ids to sample counts")


# --- control plane: peer -> backbone ---------------------------------------------------


@dataclass
class Progress:
    """What a peer has accumulated towards the current epoch's target batch."""

    TYPE: ClassVar[str] = "progress"
    epoch: int
    samples: int
    samples_per_second: float
    loss: float | None = None
    compute_seconds: float = 0.0
    client_mode: bool = False  # reachable only through a relay: send parts, reduce none

    def __post_init__(self) -> None:
        _non_negative(epoch=self.epoch, samples=self.samples, rate=self.samples_per_second,
                      compute_seconds=self.compute_seconds)


@dataclass
class SyncRequest:
    """Asks where to get the collaboration's current state from."""

    TYPE: ClassVar[str] = "sync_request"
    exclude: list[str] = field(default_factory=list)


@dataclass
class Ready:
    """The peer holds the state of ``epoch`` and may be put in rounds."""

    TYPE: ClassVar[str] = "ready"
    epoch: int
    params_sha256: str

    def __post_init__(self) -> None:
        _non_negative(epoch=self.epoch)


@dataclass
class RoundDone:
    """Outcome of one averaging round on one peer."""

    TYPE: ClassVar[str] = "round_done"
    round_id: int
    epoch: int
    ok: bool
    params_sha256: str | None = None
    samples: int = 0
    loss: float | None = None
    seconds: float = 0.0
    error: str | None = None
    confirmed: dict = field(default_factory=dict)  # sender -> samples every reducer received
    unreachable: list[str] = field(default_factory=list)  # peers it could not exchange with

    def __post_init__(self) -> None:
        _non_negative(round_id=self.round_id, epoch=self.epoch, samples=self.samples)
        _sample_counts("confirmed", self.confirmed)
        if len(self.unreachable) > 1000 or any(len(p) > 64 for p in self.unreachable):
            raise ValueError("unreachable must list peer ids")


@dataclass
class Availability:
    """The peer's owner paused it (or let it run again): leave it out of rounds meanwhile."""

    TYPE: ClassVar[str] = "availability"
    paused: bool


@dataclass
class Ping:
    """Asks the backbone for an immediate Pong: how long a message takes to be handled."""

    TYPE: ClassVar[str] = "ping"
    nonce: int


@dataclass
class Pong:
    TYPE: ClassVar[str] = "pong"
    nonce: int


@dataclass
class Signal:
    """WebRTC signaling relayed by the backbone; ``peer`` is the other end."""

    TYPE: ClassVar[str] = "signal"
    peer: str
    data: dict


# --- control plane: backbone -> peer ---------------------------------------------------


@dataclass
class CheckpointInfo:
    epoch: int
    sha256: str
    params_sha256: str
    size: int
    url: str


@dataclass
class SyncPlan:
    """Where a peer gets its state: ``init`` (fresh, seeded), a live ``peer``, or a ``checkpoint``."""

    TYPE: ClassVar[str] = "sync_plan"
    epoch: int
    source: str
    peer: str | None = None
    checkpoint: CheckpointInfo | None = None
    params_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.source not in ("init", "peer", "checkpoint"):
            raise ValueError(f"unknown state source {self.source!r}")


@dataclass
class RoundStart:
    """Opens an averaging round: who is in it and which part of the vector each reduces."""

    TYPE: ClassVar[str] = "round_start"
    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    timeout: float
    checkpoint_by: str | None = None

    def __post_init__(self) -> None:
        if len(self.group) != len(self.shares) or not self.group:
            raise ValueError("group and shares must be non-empty and of equal length")
        if len(set(self.group)) != len(self.group):
            raise ValueError("group lists a peer twice")
        if any(s < 0 for s in self.shares) or sum(self.shares) <= 0:
            raise ValueError("shares must be non-negative with a positive sum")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")


@dataclass
class EpochAdvanced:
    """The collaboration took its step for ``epoch - 1`` and now accumulates for ``epoch``."""

    TYPE: ClassVar[str] = "epoch"
    epoch: int
    loss: float | None
    samples: int
    params_sha256: str


@dataclass
class Resync:
    """Your state is behind the collaboration's: download it again."""

    TYPE: ClassVar[str] = "resync"
    epoch: int
    reason: str


@dataclass
class Status:
    """Collaboration progress, broadcast about once a second."""

    TYPE: ClassVar[str] = "status"
    epoch: int
    samples: int
    target: int
    peers: int
    samples_per_second: float
    eta_seconds: float | None = None


@dataclass
class IceServers:
    """Fresh STUN/TURN servers for the links set up from now on: TURN credentials expire,
    so the backbone sends new ones when the control socket connects and before they do."""

    TYPE: ClassVar[str] = "ice_servers"
    servers: list[dict]

    def __post_init__(self) -> None:
        if len(self.servers) > 16:
            raise ValueError("too many ICE servers")
        for server in self.servers:
            urls = server.get("urls") if isinstance(server, dict) else None
            urls = [urls] if isinstance(urls, str) else urls
            if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
                raise ValueError("each ICE server needs urls")
            if any(not isinstance(server.get(k, ""), str) for k in ("username", "credential")):
                raise ValueError("ICE server credentials must be strings")


@dataclass
class Error:
    TYPE: ClassVar[str] = "error"
    message: str


CONTROL_TYPES: dict[str, type] = {
    cls.TYPE: cls
    for cls in (
        Progress, SyncRequest, Ready, RoundDone, Signal, Ping, Availability,
        SyncPlan, RoundStart, EpochAdvanced, Resync, Status, IceServers, Error, Pong,
    )
}

# --- data plane (frame headers between peers) ------------------------------------------


@dataclass
class Part:
    """A sender's slice of its accumulated gradient sum, for the slice's reducer."""

    TYPE: ClassVar[str] = "part"
    round_id: int
    epoch: int
    index: int
    samples: int
    loss_sum: float
    dtype: str = "float32"

    def __post_init__(self) -> None:
        _non_negative(round_id=self.round_id, epoch=self.epoch, index=self.index, samples=self.samples)


@dataclass
class Result:
    """A reducer's averaged slice, the same bytes for every peer of the round."""

    TYPE: ClassVar[str] = "result"
    round_id: int
    epoch: int
    index: int
    samples: int
    loss: float | None
    dtype: str = "float32"
    received: dict = field(default_factory=dict)  # sender -> samples in the parts reduced

    def __post_init__(self) -> None:
        _non_negative(round_id=self.round_id, epoch=self.epoch, index=self.index, samples=self.samples)
        _sample_counts("received", self.received)


@dataclass
class StateRequest:
    TYPE: ClassVar[str] = "state_request"
    request_id: int


@dataclass
class StateReply:
    """Training state; the payload is a state file (see engine.wire.tensors)."""

    TYPE: ClassVar[str] = "state"
    request_id: int
    epoch: int
    params_sha256: str


@dataclass
class StateUnavailable:
    TYPE: ClassVar[str] = "state_unavailable"
    request_id: int
    reason: str


DATA_TYPES: dict[str, type] = {
    cls.TYPE: cls for cls in (Part, Result, StateRequest, StateReply, StateUnavailable)
}


def to_wire(msg: Any) -> dict:
    return {"v": WIRE_VERSION, "type": msg.TYPE, **to_dict(msg)}


def encode(msg: Any) -> str:
    return json.dumps(to_wire(msg), separators=(",", ":"))


def from_wire(data: Any, registry: dict[str, type]) -> Any:
    """Validate an untrusted JSON value into one of ``registry``'s message classes."""
    if not isinstance(data, dict):
        raise ProtocolError("message must be a JSON object")
    version = data.get("v")
    if version != WIRE_VERSION:
        raise ProtocolError(f"wire version {version!r} is not supported (expected {WIRE_VERSION})")
    kind = data.get("type")
    cls = registry.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    body = {k: v for k, v in data.items() if k not in ("v", "type")}
    return from_dict(cls, body, kind)


def decode(text: str | bytes, registry: dict[str, type] = CONTROL_TYPES) -> Any:
    if len(text) > MAX_CONTROL_MESSAGE:
        raise ProtocolError("control message too large")
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    return from_wire(data, registry)
