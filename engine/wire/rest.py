"""The bodies of the backbone's HTTP API: what clients send and what the backbone answers.

The backbone encodes its answers from these Structs, peers and the desktop app decode them
with the same Structs, and /api/openapi.json is generated from them (backbone/openapi.py).
"""

from __future__ import annotations

import re
from typing import Annotated, TypeVar

from msgspec import Meta, Struct

from engine.project import ProjectSpec
from engine.wire.codec import Codec
from engine.wire.control import CheckpointInfo
from engine.wire.ice_servers import IceServerList
from engine.wire.types import (
    Count,
    EpochNumber,
    IcePolicy,
    Loss,
    Name,
    PeerId,
    PeerRole,
    ProjectId,
    Rate,
    Seconds,
    StrEnum,
    Text,
)

T = TypeVar("T")
MAX_JSON_BODY = 64 * 1024
MAX_REPLY = 16 * 1024 * 1024  # the largest answer a client reads (a catalog, a page, a curve)
PEER_TOKEN_HEADER = "X-Cotrain-Peer-Token"
PEER_ID_HEADER = "X-Cotrain-Peer-Id"
CONTENT_SHA256_HEADER = "X-Content-SHA256"
STATE_SHA256_HEADER = "X-State-SHA256"
USERNAME_PATTERN = "^[A-Za-z0-9_.-]{3,32}$"
MIN_PASSWORD, MAX_PASSWORD = 8, 1024
_USERNAME = re.compile(USERNAME_PATTERN)


def check_username(username: str) -> None:
    """The policy for new usernames; ValueError with it."""
    if not _USERNAME.match(username):
        raise ValueError("a username is 3-32 letters, digits, '.', '_' or '-'")
Token = Annotated[str, Meta(max_length=256)]
Timestamp = Annotated[float, Meta(ge=0, le=1e11)]  # UNIX time


class ErrorReply(Struct):
    """Every refusal: a 4xx status and the reason, for people."""

    error: Text


# The most a link probe moves each way (engine/backbone/api_probe.py).
PROBE_BYTES = 16 * 1024 * 1024


class ProbeReply(Struct):
    received: int  # bytes of the upload probe the backbone took


class Health(Struct):
    ok: bool
    version: Name
    wire_version: int


class RegisterRequest(Struct):
    """A new account; the policy for usernames and passwords applies here only, checked in
    ``__post_init__`` so that a person reads the rule rather than a regular expression."""

    username: Annotated[str, Meta(extra_json_schema={"pattern": USERNAME_PATTERN})]
    password: Annotated[str, Meta(extra_json_schema={"minLength": MIN_PASSWORD, "maxLength": MAX_PASSWORD})]

    def __post_init__(self) -> None:
        check_username(self.username)
        if not MIN_PASSWORD <= len(self.password) <= MAX_PASSWORD:
            raise ValueError(f"password must be {MIN_PASSWORD} to {MAX_PASSWORD} characters")


class LoginRequest(Struct):
    """Any username and password a person may type (the body's size is the only bound): a
    wrong one is answered 401, whatever the registration policy is today (raising its
    minimum must not lock anyone out)."""

    username: str
    password: str


class LoginReply(Struct):
    """The bearer token of a new log-in."""

    username: Name
    token: Token


class Revoked(Struct):
    revoked: bool


class LoginSession(Struct):
    """One of a user's log-ins (a token), without the token."""

    id: Annotated[int, Meta(ge=1)]
    client: Text  # what logged in, as its User-Agent said
    created: Timestamp
    last_used: Timestamp
    expires: Timestamp  # unless used before: each use extends it
    current: bool  # the token this request presented


class SessionList(Struct):
    sessions: list[LoginSession]


class JoinRequest(Struct, kw_only=True):
    name: Name = ""
    version: Name = ""  # the peer's Cotrain release
    wire: int = 1  # releases before wire v2 did not say
    role: PeerRole = PeerRole.TRAINER

    def __post_init__(self) -> None:
        if not self.name.isprintable():
            raise ValueError("name must be printable")


class JoinReply(Struct, kw_only=True):
    peer_id: PeerId
    token: Token
    project: ProjectSpec
    ice_servers: IceServerList
    ice_policy: IcePolicy = IcePolicy.ALL
    report_interval: Annotated[float, Meta(gt=0, le=60)] = 0.5
    max_checkpoint_bytes: Annotated[int, Meta(ge=0, le=2**48)] = 1 << 30
    username: Name | None = None
    wire_version: int = 1  # releases before wire v2 did not say


class ProjectSummary(ProjectSpec, kw_only=True):
    """A project with the collaboration's live progress."""

    epoch: EpochNumber
    peers: Count
    samples: Count
    samples_per_second: Rate
    eta_seconds: Seconds | None


class ProjectList(Struct):
    projects: list[ProjectSummary]


class CurvePoint(Struct):
    epoch: EpochNumber
    loss: Loss | None
    samples: Count
    peers: Count
    round_seconds: Seconds
    finished_at: Timestamp
    # The held-out set's mean loss and accuracy on this epoch's state, where peers scored it
    # (the median of what members holding that state said).
    heldout_loss: Loss | None = None
    heldout_accuracy: Annotated[float, Meta(ge=0, le=1)] | None = None


class Curve(Struct):
    """Loss per epoch: the latest step of each epoch, after any rewind."""

    project: ProjectId
    epochs: list[CurvePoint]


class Ranking(StrEnum):
    """What a leaderboard ranks users by."""

    SAMPLES = "samples"  # samples computed (training peers)
    AGGREGATED = "aggregated"  # bytes aggregated for the others (auxiliary peers)


class LeaderboardEntry(Struct, kw_only=True):
    rank: Count
    username: Name
    samples: Count
    share: Annotated[float, Meta(ge=0, le=1)]  # of what the ranking counts
    compute_seconds: Seconds
    last_seen: Annotated[str, Meta(max_length=32)] | None  # ISO 8601, UTC
    online: bool
    aggregated_bytes: Count = 0
    withdrawn: Count = 0  # samples credited once, taken back: a peer of the user was caught lying


class Leaderboard(Struct, kw_only=True):
    project: ProjectId
    total_samples: Count
    limit: Count
    offset: Count
    entries: list[LeaderboardEntry]
    total_aggregated_bytes: Count = 0
    by: Ranking = Ranking.SAMPLES


class ProjectTotals(Struct, kw_only=True):
    """A user's credited work in one project."""

    project: ProjectId
    samples: Count
    compute_seconds: Seconds
    online_seconds: Seconds
    last_seen: Timestamp
    rank: Count | None = None
    online: bool = False
    aggregated_bytes: Count = 0  # as an auxiliary peer
    aggregated_rank: Count | None = None
    withdrawn: Count = 0  # samples credited once, taken back: a peer of the user was caught lying


class HourTotals(Struct):
    project: ProjectId
    hour: Timestamp  # UNIX time of the hour's start
    samples: Count
    compute_seconds: Seconds
    aggregated_bytes: Count = 0


class Me(Struct):
    username: Name
    projects: list[ProjectTotals]
    timeline: list[HourTotals]  # credited work per project and hour, the last week


class CheckpointList(Struct):
    checkpoints: list[CheckpointInfo]


_reply_codecs: dict[type, Codec] = {}


def reply_codec(type_: type[T]) -> Codec[T]:
    """How a client reads one of these answers (one decoder per kind, made once)."""
    codec = _reply_codecs.get(type_)
    if codec is None:
        codec = _reply_codecs[type_] = Codec(type_, f"the backbone's {type_.__name__}", MAX_REPLY)
    return codec

