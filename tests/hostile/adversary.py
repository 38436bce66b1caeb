"""The adversary: a stranger that speaks the public protocol (the HTTP API, the control
WebSocket, WebRTC data channels) from its own addresses (127.0.0.2 and up), and lies as it likes.
It uses the wire's message types to write its messages and nothing of the honest peer's
logic."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from engine.transport.ice import ice_configuration
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire import WIRE_VERSION, ProtocolError
from engine.wire.codec import encode, encode_text
from engine.wire.control import (
    BackboneMessage,
    ControlMessage,
    Progress,
    Ready,
    Resync,
    RoundStart,
    Signal,
    SignalData,
    Step,
    from_backbone,
)
from engine.wire.framing import Frame
from engine.wire.rest import PEER_ID_HEADER, PEER_TOKEN_HEADER, JoinReply, JoinRequest, reply_codec
from engine.wire.types import PeerRole

_addresses = itertools.count(2)
# The data plane's first chunk of a message, as the wire defines it (engine/wire/framing.py):
# magic, wire version, flags (1: first, 2: last), message id, header length, payload length.
FIRST_CHUNK = struct.Struct("!2sBBIIQ")


def first_chunk(msg_id: int, header: bytes, payload_length: int, body: bytes = b"",
                last: bool = False) -> bytes:
    """The first chunk of a message that may claim anything about itself."""
    flags = 1 | (2 if last else 0)
    return FIRST_CHUNK.pack(b"CT", WIRE_VERSION, flags, msg_id, len(header), payload_length) + header + body


def next_chunk(msg_id: int, body: bytes, last: bool = False) -> bytes:
    """A later chunk (magic, wire version, flags, message id), for whatever message it likes."""
    return struct.pack("!2sBBI", b"CT", WIRE_VERSION, 2 if last else 0, msg_id) + body


def new_address() -> str:
    """Another machine of the adversary's (each test attacks from its own: a backbone that
    refused one for flooding would refuse it in the next test too)."""
    return f"127.0.0.{next(_addresses)}"


_join_reply = reply_codec(JoinReply)


class Refused(RuntimeError):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{status}: {text}")
        self.status = status


@dataclass
class Stranger:
    """One identity: joined through the public API, its control socket open."""

    peer_id: str
    token: str
    ws: aiohttp.ClientWebSocketResponse
    received: list[BackboneMessage] = field(default_factory=list)
    settled: tuple[int, str] | None = None  # the collaboration's epoch and hash, from its broadcasts
    follow: bool = False  # answer every Step and Resync with Ready(settled): stay a ready member
    on_message: Callable[[BackboneMessage], None] | None = None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    in_a_round: asyncio.Event = field(default_factory=asyncio.Event)
    knows_state: asyncio.Event = field(default_factory=asyncio.Event)  # ``settled`` is set
    reader: asyncio.Task | None = None
    tasks: set[asyncio.Future] = field(default_factory=set)

    async def send(self, msg: ControlMessage) -> bool:
        return await self.send_raw(encode_text(msg))

    async def send_raw(self, text: str) -> bool:
        if self.ws.closed:
            return False
        try:
            await self.ws.send_str(text)
        except (ConnectionError, RuntimeError):
            return False
        return True

    async def read(self) -> None:
        try:
            async for raw in self.ws:
                if raw.type != aiohttp.WSMsgType.TEXT:
                    break
                try:
                    msg = from_backbone.decode(raw.data)
                except ProtocolError:
                    continue
                self.received.append(msg)
                if isinstance(msg, RoundStart):
                    self.in_a_round.set()
                if isinstance(msg, Step) or (isinstance(msg, Resync) and msg.state_sha256):
                    self.settled = (msg.epoch, msg.state_sha256)
                    self.knows_state.set()
                if self.follow and isinstance(msg, (Step, Resync)) and self.settled:
                    await self.send(Ready(*self.settled))
                if self.on_message is not None:
                    self.on_message(msg)
        finally:
            self.closed.set()

    def later(self, msg: ControlMessage) -> None:
        """Send ``msg`` from a callback that cannot wait."""
        task = asyncio.ensure_future(self.send(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def rounds(self) -> list[RoundStart]:
        return [m for m in self.received if isinstance(m, RoundStart)]

    async def close(self) -> None:
        await self.ws.close()
        if self.reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.reader


async def member(stranger: Stranger, samples: int = 10**6) -> None:
    """Keep ``stranger`` a live member in the backbone's eyes without computing anything:
    ready at the settled epoch (the hash is broadcast with every step) once per epoch, as a
    peer that follows the collaboration is, and reporting ``samples`` -- a claim the backbone
    counts only as far as the time since its Ready allows. (It never repeats a Ready within
    an epoch -- the Ready-then-Progress attack has its own test -- and never asks for the
    state: that would be the state-request attack, which holds rounds back a twentieth of
    the time at most, and has its own test too.)"""
    stranger.follow = True
    await asyncio.wait_for(stranger.knows_state.wait(), 60)
    assert stranger.settled is not None
    await stranger.send(Ready(*stranger.settled))
    while not stranger.closed.is_set():
        assert stranger.settled is not None
        await stranger.send(Progress(stranger.settled[0], samples, float(samples)))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stranger.closed.wait(), 0.4)


class Adversary:
    def __init__(self, url: str, project: str, address: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.project = project
        self.address = address or new_address()
        self.strangers: list[Stranger] = []
        self.meshes: list[PeerMesh] = []
        self.http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Adversary:
        connector = aiohttp.TCPConnector(local_addr=(self.address, 0), limit=0)
        self.http = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30))
        return self

    async def __aexit__(self, *exc) -> None:
        for mesh in self.meshes:
            await mesh.close()
        for stranger in self.strangers:
            await stranger.close()
        assert self.http is not None
        await self.http.close()

    @property
    def peer_ids(self) -> list[str]:
        return [s.peer_id for s in self.strangers]

    async def join(self, name: str = "mallory", follow: bool = False,
                   role: PeerRole = PeerRole.TRAINER) -> Stranger:
        """A new identity, its control socket open; Refused if the backbone says no."""
        assert self.http is not None
        body = encode(JoinRequest(name=name, version="0", wire=WIRE_VERSION, role=role))
        async with self.http.post(f"{self.url}/api/projects/{self.project}/peers", data=body,
                                  headers={"Content-Type": "application/json"}) as resp:
            text = await resp.text()
            if resp.status != 201:
                raise Refused(resp.status, text)
        reply = _join_reply.decode(text)
        ws = await self.open_socket(reply.peer_id, reply.token)
        stranger = Stranger(reply.peer_id, reply.token, ws, follow=follow)
        stranger.reader = asyncio.ensure_future(stranger.read())
        self.strangers.append(stranger)
        return stranger

    async def open_socket(self, peer_id: str, token: str) -> aiohttp.ClientWebSocketResponse:
        assert self.http is not None
        url = f"{self.url}/api/projects/{self.project}/peers/{peer_id}/ws"
        try:
            headers = {PEER_ID_HEADER: peer_id, PEER_TOKEN_HEADER: token}
            return await self.http.ws_connect(url, headers=headers, heartbeat=15)
        except aiohttp.WSServerHandshakeError as exc:
            raise Refused(exc.status, exc.message) from None

    async def scout(self, timeout: float = 60) -> list[str]:
        """The honest peers' ids, as a round's members list shows them to a member."""
        scout = await self.join("scout")
        watching = asyncio.ensure_future(member(scout))
        try:
            await asyncio.wait_for(scout.in_a_round.wait(), timeout)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        return [p for p in scout.rounds()[-1].group if p not in self.peer_ids]

    def mesh(self, stranger: Stranger, on_frame: Callable[[str, Frame], None] | None = None) -> PeerMesh:
        """WebRTC links for ``stranger``, signalled through its control socket."""

        async def send_signal(target: str, data: SignalData) -> None:
            await stranger.send(Signal(target, data))

        mesh = PeerMesh(stranger.peer_id, send_signal, ice_configuration([]), Mailbox(),
                        on_frame or (lambda sender, frame: None))
        previous = stranger.on_message

        def route(msg: BackboneMessage) -> None:
            if isinstance(msg, Signal):
                mesh.spawn(mesh.handle_signal(msg.peer, msg.data))
            if previous is not None:
                previous(msg)

        stranger.on_message = route
        self.meshes.append(mesh)
        return mesh
