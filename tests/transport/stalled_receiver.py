"""A receiving peer in its own process whose event loop stalls on command, as a peer's does
while its processor is busy elsewhere. Signals and commands come as JSON lines on stdin;
signals and results go out on stdout.

    python -m tests.transport.stalled_receiver   (driven by tests/transport/test_stall.py)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time

import msgspec

from engine.aio import spawn
from engine.averaging.allreduce import round_key
from engine.transport.backends import restrict_host_addresses
from engine.transport.ice import ice_configuration
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire.control import SignalData
from tests.transport.mesh_pair import router, transports


def say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def main() -> None:
    restrict_host_addresses(["127.0.0.1"])
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    mailbox = Mailbox()

    async def send_signal(target: str, data: SignalData) -> None:
        say({"signal": msgspec.to_builtins(data)})

    mesh = PeerMesh("b", send_signal, ice_configuration([]), mailbox, router(mailbox))
    while line := await reader.readline():
        command = json.loads(line)
        if "signal" in command:
            spawn(mesh.handle_signal("a", msgspec.convert(command["signal"], SignalData)))
        elif "stall" in command:
            say({"stalling": True})
            time.sleep(command["stall"])  # the stall itself: nothing runs on this loop meanwhile
        elif "expect" in command:
            digest = hashlib.sha256()
            for i in range(command["expect"]):
                frame = await mailbox.get(round_key("part", i, 0, "a"), timeout=60)
                digest.update(frame.payload)
            say({"sha256": digest.hexdigest(), "stack": transports(mesh).get("a")})
    await mesh.close()


if __name__ == "__main__":
    from engine.aio import run

    run(main())  # uvloop, as a peer runs
