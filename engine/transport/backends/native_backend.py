"""Links on libwebrtc (Chrome's stack, through wrtc): SCTP and DTLS in native threads, about
a quarter of aiortc's processor time per byte and several times its speed.

Imported only when wrtc is installed and importable (engine/transport/backends/__init__.py).
libwebrtc has no option to offer only some interfaces as host candidates, so the choice is
applied to the SDP: our offers and answers carry only the allowed host candidates (and the
server-reflexive ones gathered from them), and the other side's disallowed ones are ignored.
Our other interfaces may still send connectivity checks to the allowed addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging

import webrtc

from engine.transport.connection import Bytes, ConnectionFailed, SelectedPair, StackConnection
from engine.transport.ice import IceSettings
from engine.wire.types import Transport

log = logging.getLogger(__name__)

_allowed: list[str] = []
_loopback_allowed = False


def restrict_host_addresses(addresses: list[str]) -> None:
    """Offer only ``addresses`` as host candidates (empty: every interface but loopback)."""
    global _allowed, _loopback_allowed
    _allowed = [str(ipaddress.ip_address(a)) for a in addresses]
    if not _loopback_allowed and any(ipaddress.ip_address(a).is_loopback for a in _allowed):
        try:
            webrtc.allow_loopback()  # libwebrtc skips loopback candidates otherwise
            _loopback_allowed = True
        except webrtc.InvalidStateError:
            log.warning("loopback candidates must be allowed before the first connection: "
                        "native links cannot use %s", ", ".join(_allowed))


def _kept(line: str) -> bool:
    """Whether a candidate line of an SDP passes the host-address restriction."""
    if not line.startswith("a=candidate:"):
        return True
    fields = line.split()
    try:
        address, kind = fields[4], fields[fields.index("typ") + 1]
    except (IndexError, ValueError):
        return False
    if kind == "host":
        base = address
    elif kind == "srflx" and "raddr" in fields:
        base = fields[fields.index("raddr") + 1]
    else:
        return True
    try:
        ip = ipaddress.ip_address(base)
    except ValueError:
        return False  # an mDNS name: it could be any interface
    if _allowed:
        return str(ip) in _allowed
    return not ip.is_loopback


def restricted(sdp: str) -> str:
    if not _allowed and not _loopback_allowed:
        return sdp
    return "".join(line for line in sdp.splitlines(keepends=True) if _kept(line.rstrip("\r\n")))


def configuration(ice: IceSettings) -> webrtc.RTCConfiguration:
    servers = [webrtc.RTCIceServer(urls=list(s.urls), username=s.username, credential=s.credential)
               for s in ice.servers]
    policy = webrtc.RTCIceTransportPolicy.relay if ice.relay_only else webrtc.RTCIceTransportPolicy.all
    return webrtc.RTCConfiguration(ice_servers=servers, ice_transport_policy=policy)


class NativeConnection(StackConnection):
    transport = Transport.NATIVE

    def __init__(self, ice: IceSettings) -> None:
        super().__init__()
        self.pc = webrtc.RTCPeerConnection(configuration(ice))
        init = webrtc.RTCDataChannelInit(ordered=True, negotiated=True, id=0)
        self.channel = self.pc.create_data_channel("cotrain", init)
        self._gathered = asyncio.Event()
        self._state = asyncio.Event()
        self.channel.on("message", self._message)
        self.channel.on("bufferedamountlow", lambda _event: self.on_drained())
        self.channel.on("close", lambda _event: self.on_closed())
        # The other side closed its end: with our own sends still queued, libwebrtc would
        # report "close" only once they drain, and they never will (seen in the hostile tests).
        self.channel.on("closing", lambda _event: self.on_closed())
        self.channel.on("open", lambda _event: self._state.set())
        self.pc.on("connectionstatechange", self._state_changed)
        self.pc.on("icegatheringstatechange", self._gathering_changed)

    def _message(self, event: webrtc.MessageEvent) -> None:
        # A text message or a blob is not a frame: the link's reassembler refuses it.
        self.on_message(event.data)  # type: ignore[arg-type]

    def _state_changed(self, _event: object) -> None:
        self._state.set()
        if self._failed:
            self.on_closed()

    @property
    def _failed(self) -> bool:
        return self.pc.connection_state.value in ("failed", "closed")

    def _gathering_changed(self, _event: object) -> None:
        if self.pc.ice_gathering_state.value == "complete":
            self._gathered.set()

    async def _local_sdp(self) -> str:
        await self._gathered.wait()
        description = self.pc.local_description
        assert description is not None
        return restricted(description.sdp)

    async def offer(self) -> str:
        await self.pc.set_local_description(await self.pc.create_offer())
        return await self._local_sdp()

    async def answer(self, offer: str) -> str:
        await self.pc.set_remote_description(
            webrtc.RTCSessionDescriptionInit(type="offer", sdp=restricted(offer)))
        await self.pc.set_local_description(await self.pc.create_answer())
        return await self._local_sdp()

    async def accept(self, answer: str) -> None:
        await self.pc.set_remote_description(
            webrtc.RTCSessionDescriptionInit(type="answer", sdp=restricted(answer)))

    async def opened(self) -> None:
        while not self.is_open:
            if self._failed:
                raise ConnectionFailed(f"connection {self.pc.connection_state.value}")
            self._state.clear()
            await self._state.wait()

    @property
    def is_open(self) -> bool:
        return self.channel.ready_state.value == "open"

    @property
    def buffered_amount(self) -> int:
        return self.channel.buffered_amount

    def set_low_water(self, size: int) -> None:
        self.channel.buffered_amount_low_threshold = size

    def send(self, message: Bytes) -> None:
        try:
            self.channel.send(message)
        except (webrtc.InvalidStateError, webrtc.OperationError) as exc:
            raise ConnectionFailed(f"channel refused a message: {exc}") from exc

    def selected_pair(self) -> SelectedPair | None:
        sctp = self.pc.sctp
        if sctp is None:
            return None
        pair = sctp.transport.ice_transport.get_selected_candidate_pair()
        if pair is None:
            return None
        return SelectedPair(_type(pair.local), _type(pair.remote))

    async def close(self) -> None:
        # Reset our end of the channel first: the other side hears of that at once, even
        # with its own sends queued, where closing the connection alone can leave it
        # waiting on an association that no longer answers.
        if self.is_open:
            self.channel.close()
        self.pc.close()


def _type(candidate: webrtc.RTCIceCandidate) -> str:
    kind = candidate.type
    return "prflx" if kind is None else str(getattr(kind, "value", kind))
