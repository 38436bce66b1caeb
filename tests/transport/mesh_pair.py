"""Meshes wired to each other through an in-test signaling relay (the backbone's job in production)."""

from __future__ import annotations

from engine.aio import spawn
from engine.transport.ice import ice_configuration
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh


def make_meshes(names, connect_timeout: float = 20.0) -> dict[str, PeerMesh]:
    meshes: dict[str, PeerMesh] = {}

    def relay(sender):
        async def send(target, data):
            if meshes.get(target) is not None:  # signals to an absent peer go nowhere
                spawn(meshes[target].handle_signal(sender, data))
        return send

    for name in names:
        mailbox = Mailbox()

        def route(sender, frame, mailbox=mailbox):
            ident = frame.header.get("round_id", frame.header.get("request_id", 0))
            mailbox.put((frame.type, ident, sender), frame)

        meshes[name] = PeerMesh(name, relay(name), ice_configuration([]), mailbox, route,
                                connect_timeout=connect_timeout)
    return meshes
