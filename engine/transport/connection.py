"""What a link needs of a WebRTC stack: one connection to one peer carrying one reliable,
ordered data channel. Each stack (engine/transport/backends/) implements this and keeps
its own quirks to itself; the link, the mesh, averaging and state sync see only this."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from engine.wire.types import LinkPath, Transport

Bytes = bytes | bytearray | memoryview


class ConnectionFailed(ConnectionError):
    """The connection failed or closed before its channel opened."""


@dataclass(frozen=True)
class SelectedPair:
    """The candidate types of the pair ICE selected: host, srflx, prflx or relay."""

    local: str
    remote: str

    @property
    def path(self) -> LinkPath:
        kinds = {self.local, self.remote}
        if "relay" in kinds:
            return LinkPath.RELAY
        return LinkPath.SRFLX if kinds & {"srflx", "prflx"} else LinkPath.HOST

    @property
    def relayed_here(self) -> bool | None:
        """Whether the link needs this side's own TURN relay: True when it leaves through it
        although the other side answers at its own host address, False when no relay is
        involved. None otherwise: when a relay is needed between two NATs, which end's relay
        ICE picks is the stack's choice (aiortc tends to take the symmetric NAT's, libwebrtc
        the cone's: seen in the NAT tests), a side whose pair starts at its host candidate
        may still sit behind a NAT, and when both ends are relayed, ICE may pick our relay
        against a relay-only peer even when our direct candidates would do (seen in CI)."""
        if "relay" not in (self.local, self.remote):
            return False
        return True if self.local == "relay" and self.remote == "host" else None


def _ignore(*_: object) -> None:
    """No listener yet."""


class StackConnection(ABC):
    """A peer connection with its data channel, listening from creation: the other side may
    send the moment its end opens. Set the ``on_*`` callbacks before offering or answering."""

    transport: ClassVar[Transport]

    def __init__(self) -> None:
        self.on_message: Callable[[bytes], None] = _ignore
        self.on_drained: Callable[[], None] = _ignore  # buffered_amount fell to low_water
        self.on_closed: Callable[[], None] = _ignore  # the channel or the connection is gone

    @abstractmethod
    async def offer(self) -> str:
        """Our offer's SDP, with every candidate gathered (signaling does not trickle)."""

    @abstractmethod
    async def answer(self, offer: str) -> str:
        """Take the other side's offer; our answer's SDP."""

    @abstractmethod
    async def accept(self, answer: str) -> None:
        """Take the other side's answer to our offer."""

    @abstractmethod
    async def opened(self) -> None:
        """Return once the channel is open; raise ConnectionFailed if the connection fails first."""

    @property
    @abstractmethod
    def is_open(self) -> bool: ...

    @property
    @abstractmethod
    def buffered_amount(self) -> int:
        """Bytes handed to ``send`` and not yet on the wire."""

    @abstractmethod
    def set_low_water(self, size: int) -> None: ...

    @abstractmethod
    def send(self, message: Bytes) -> None:
        """Queue one message (at most MAX_CHUNK bytes); never drops it while the channel is open."""

    @abstractmethod
    def selected_pair(self) -> SelectedPair | None:
        """How ICE connected us (None before it has)."""

    @abstractmethod
    async def close(self) -> None: ...
