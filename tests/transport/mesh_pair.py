"""Meshes wired to each other through an in-test signaling relay (the backbone's job in production)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.aio import spawn
from engine.averaging.allreduce import round_key
from engine.transport.ice import ice_configuration
from engine.transport.mailbox import Key, Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire.frames import Part, Result, Shown
from engine.wire.framing import Frame
from engine.wire.types import Transport


def blob(round_id: int) -> Part:
    """A frame header for test payloads, delivered as round_key("part", round_id, 0, sender)."""
    return Part(round_id=round_id, epoch=0, index=0, samples=1, loss_sum=0.0)


def transports(mesh: PeerMesh) -> dict[str, Transport]:
    """The stack each of ``mesh``'s open links runs on, on its side."""
    return {p: link.transport for p, link in mesh.open_links().items()}


def router(mailbox: Mailbox) -> Callable[[str, Frame], None]:
    """Frames into ``mailbox`` where the all-reduce looks for them (the peer's job in production)."""

    def route(sender: str, frame: Frame) -> None:
        header = frame.header
        if isinstance(header, (Part, Result, Shown)):
            mailbox.put(round_key(header.__struct_config__.tag, header.round_id, header.index, sender), frame)
        else:
            ident = getattr(header, "round_id", getattr(header, "request_id", 0))
            mailbox.put(Key(header.__struct_config__.tag, ident, (), sender), frame)

    return route


def make_meshes(names, connect_timeout: float = 20.0, signals: list | None = None) -> dict[str, PeerMesh]:
    """``signals``, if given, records each signal sent as (sender, target, kind, loop time)."""
    meshes: dict[str, PeerMesh] = {}

    def relay(sender):
        async def send(target, data):
            if signals is not None:
                signals.append((sender, target, data.kind, asyncio.get_running_loop().time()))
            if meshes.get(target) is not None:  # signals to an absent peer go nowhere
                spawn(meshes[target].handle_signal(sender, data))
        return send

    for name in names:
        mailbox = Mailbox()
        meshes[name] = PeerMesh(name, relay(name), ice_configuration([]), mailbox, router(mailbox),
                                connect_timeout=connect_timeout)
    return meshes
