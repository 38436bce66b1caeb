"""Links on aiortc: pure Python (SCTP, DTLS, ICE), on every platform; the fallback stack."""

from __future__ import annotations

import asyncio

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCPeerConnection,
    RTCSessionDescription,
)

from engine.transport.backends import aiortc_patches
from engine.transport.connection import Bytes, ConnectionFailed, SelectedPair, StackConnection
from engine.transport.ice import IceSettings
from engine.wire.types import Transport


def configuration(ice: IceSettings) -> RTCConfiguration:
    """aiortc's configuration; never its public default STUN server (iceServers=None)."""
    servers = [RTCIceServer(urls=s.urls, username=s.username, credential=s.credential) for s in ice.servers]
    policy = RTCIceTransportPolicy.RELAY if ice.relay_only else RTCIceTransportPolicy.ALL
    return RTCConfiguration(iceServers=servers, iceTransportPolicy=policy)


class AiortcConnection(StackConnection):
    transport = Transport.AIORTC

    def __init__(self, ice: IceSettings) -> None:
        super().__init__()
        aiortc_patches.apply()
        self.pc = RTCPeerConnection(configuration(ice))
        self.channel = self.pc.createDataChannel("cotrain", ordered=True, negotiated=True, id=0)
        self.channel.on("message", lambda data: self.on_message(data))
        self.channel.on("bufferedamountlow", lambda: self.on_drained())
        self.channel.on("close", lambda: self.on_closed())
        self.pc.on("connectionstatechange", self._state_changed)

    def _state_changed(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            self.on_closed()

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def answer(self, offer: str) -> str:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return self.pc.localDescription.sdp

    async def accept(self, answer: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

    async def opened(self) -> None:
        if self.channel.readyState == "open":
            return
        opened = asyncio.get_running_loop().create_future()

        def on_open() -> None:
            if not opened.done():
                opened.set_result(None)

        def on_state() -> None:
            if self.pc.connectionState in ("failed", "closed") and not opened.done():
                opened.set_exception(ConnectionFailed(f"connection {self.pc.connectionState}"))

        self.channel.on("open", on_open)
        self.pc.on("connectionstatechange", on_state)
        try:
            await opened
        finally:
            self.channel.remove_listener("open", on_open)
            self.pc.remove_listener("connectionstatechange", on_state)

    @property
    def is_open(self) -> bool:
        return self.channel.readyState == "open"

    @property
    def buffered_amount(self) -> int:
        return self.channel.bufferedAmount

    def set_low_water(self, size: int) -> None:
        self.channel.bufferedAmountLowThreshold = size

    def send(self, message: Bytes) -> None:
        # aiortc keeps a reference until SCTP has cut it up: hand it an immutable message.
        self.channel.send(message if isinstance(message, bytes) else bytes(message))

    def selected_pair(self) -> SelectedPair | None:
        return aiortc_patches.nominated_pair(self.pc)

    async def close(self) -> None:
        await self.pc.close()
