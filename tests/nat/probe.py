"""One end of a connectivity probe, run inside a network namespace.

Joins a project on a real backbone (signaling and ICE servers as a peer gets them),
connects to the other probe, reports the path ICE selected and how long set-up took, then
averages a fixed tensor with it. Prints one JSON line: {"ok", "path", "relayed_here",
"connect_seconds", "allreduce_seconds"} or {"ok": false, "error", "after_seconds"}.

    python -m tests.nat.probe --backbone URL --project ID --name a --rendezvous DIR --other b
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time
from pathlib import Path

import torch

from engine.aio import run, spawn
from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.round_plan import RoundPlan
from engine.peer.client import ControlClient
from engine.transport.ice import ice_configuration
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire.control import Signal
from engine.wire.types import IcePolicy
from tests.transport.mesh_pair import router


async def wait_for_file(path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other probe never wrote {path.name}")
        await asyncio.sleep(0.05)  # polling a file another process writes; bounded above
    return path.read_text()


def publish(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.tmp").write_text(text)
    (folder / f"{name}.tmp").rename(folder / name)


async def probe(args: argparse.Namespace) -> dict:
    client = ControlClient(args.backbone, args.project, args.name)
    reply = await client.join()
    mailbox = Mailbox()
    route = router(mailbox)
    relay_only = args.relay_only or reply.ice_policy is IcePolicy.RELAY
    mesh = PeerMesh(reply.peer_id, lambda peer, data: client.send(Signal(peer, data)),
                    ice_configuration(reply.ice_servers, relay_only), mailbox, route,
                    connect_timeout=args.connect_timeout)

    async def control() -> None:
        async for msg in client.messages():
            if isinstance(msg, Signal):
                spawn(mesh.handle_signal(msg.peer, msg.data))

    listener = asyncio.ensure_future(control())
    rendezvous = Path(args.rendezvous)
    publish(rendezvous, args.name, reply.peer_id)
    other = await wait_for_file(rendezvous / args.other, 60)
    start = time.monotonic()
    try:
        link = await mesh.link(other)
        connected = time.monotonic() - start
        await asyncio.wait_for(link.path_announced.wait(), 10)
        path, relayed_here = link.path, link.relayed_here
        n = args.tensor_mb * (1 << 20) // 4
        value = 1.0 if args.name < args.other else 3.0
        plan = RoundPlan(round_id=1, epoch=0, group=sorted([reply.peer_id, other]), shares=[0.5, 0.5],
                         me=reply.peer_id)
        began = time.monotonic()
        averaged = await butterfly_allreduce(plan, torch.full((n,), value), 1, 0.0, mesh, timeout=300)
        averaging = time.monotonic() - began
        ok = bool(torch.allclose(averaged.vector, torch.full((n,), 2.0)))
        # Closing now could cut the other probe off before it has read our last message.
        publish(rendezvous, f"{args.name}.done", "")
        await wait_for_file(rendezvous / f"{args.other}.done", 60)
        return {"ok": ok, "path": path, "relayed_here": relayed_here, "connect_seconds": round(connected, 3),
                "allreduce_seconds": round(averaging, 3), "peer_id": reply.peer_id,
                **({} if ok else {"error": "averaged values are wrong"})}
    except Exception as exc:  # the probe's job is to report what happened
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                "after_seconds": round(time.monotonic() - start, 3)}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(mesh.close(), 10)
        listener.cancel()
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backbone", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--other", required=True)
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--relay-only", action="store_true")
    parser.add_argument("--connect-timeout", type=float, default=20.0)
    parser.add_argument("--tensor-mb", type=int, default=4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    result = run(probe(args))
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
