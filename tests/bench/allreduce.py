"""Averaging a 25M-element fp32 gradient on loopback, each peer its own process:
Cotrain's butterfly all-reduce over WebRTC, next to raw aiortc data-channel throughput
and torch.distributed's gloo all_reduce of the same tensor. Prints seconds and ratios.

    python -m tests.bench.allreduce [--quick]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from engine.wire.framing import MAX_CHUNK

NUMEL = 25_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Cotrain peers ------------------------------------------------------------------------

def _cotrain_peer(url: str, project: str, conn, numel: int, rounds: int, raw_bytes: int) -> None:
    import logging

    from engine import aio

    # Warnings say why a round failed; COTRAIN_BENCH_LOG=INFO (or DEBUG) says more.
    logging.basicConfig(level=os.environ.get("COTRAIN_BENCH_LOG", "WARNING"),
                        format="%(asctime)s %(process)d %(name)s: %(message)s")

    aio.run(_cotrain_peer_main(url, project, conn, numel, rounds, raw_bytes))


async def _cotrain_peer_main(url, project, conn, numel, rounds, raw_bytes) -> None:
    import torch

    from engine.aio import spawn
    from engine.averaging.allreduce import RoundPlan, butterfly_allreduce
    from engine.peer.client import ControlClient
    from engine.transport.ice import ice_configuration
    from engine.transport.mailbox import Mailbox
    from engine.transport.mesh import PeerMesh
    from engine.transport.patches import restrict_host_addresses
    from engine.wire.control import Signal
    from tests.transport.mesh_pair import router

    torch.set_num_threads(1)
    restrict_host_addresses(["127.0.0.1"])
    loop = asyncio.get_running_loop()
    recv = lambda: loop.run_in_executor(None, conn.recv)  # noqa: E731
    client = ControlClient(url, project, "bench")
    reply = await client.join()
    mailbox = Mailbox()
    mesh = PeerMesh(reply.peer_id, lambda p, d: client.send(Signal(p, d)), ice_configuration([]),
                    mailbox, router(mailbox))

    async def dispatch():
        async for msg in client.messages():
            if isinstance(msg, Signal):
                spawn(mesh.handle_signal(msg.peer, msg.data))

    dispatcher = asyncio.ensure_future(dispatch())
    conn.send(reply.peer_id)
    group = await recv()
    me = reply.peer_id
    await asyncio.gather(*(mesh.link(p, timeout=60) for p in group if p != me))
    vector = torch.randn(numel, generator=torch.Generator().manual_seed(group.index(me)))
    while True:
        command = await recv()
        if command == "stop":
            break
        if command == "round":
            plan = RoundPlan(await recv(), 0, group, [1.0] * len(group), me)
            await butterfly_allreduce(plan, vector, 1, 0.0, mesh, timeout=900)
            conn.send("done")
        elif command in ("raw-send", "framed-send", "raw-recv", "framed-recv"):
            other = next(p for p in group if p != me)
            await _one_way(command, mesh, other, mailbox, raw_bytes, conn)
    dispatcher.cancel()
    await mesh.close()
    await client.close()


async def _one_way(command, mesh, other, mailbox, total, conn) -> None:
    from engine.averaging.allreduce import round_key
    from engine.wire.frames import Part

    link = await mesh.link(other)
    if command.startswith("raw"):
        channel = link.pc.createDataChannel("raw", negotiated=True, id=1)
    if command == "raw-recv":
        done = asyncio.get_running_loop().create_future()
        got = 0

        def on_message(data):
            nonlocal got
            got += len(data)
            if got >= total and not done.done():
                done.set_result(None)

        channel.on("message", on_message)
        conn.send("listening")
        await done
        conn.send("done")
    elif command == "raw-send":
        await _until_open(channel)
        chunk = os.urandom(MAX_CHUNK)
        drained = asyncio.Event()
        channel.bufferedAmountLowThreshold = 1 << 20
        channel.on("bufferedamountlow", drained.set)
        sent = 0
        while sent < total:
            while channel.bufferedAmount > 4 << 20:
                drained.clear()
                await drained.wait()
            channel.send(chunk)
            sent += len(chunk)
        conn.send("sent")
    elif command == "framed-recv":
        conn.send("listening")
        await mailbox.get(round_key("part", 0, 0, other), timeout=900)
        conn.send("done")
    else:
        await link.send(Part(round_id=0, epoch=0, index=0, samples=1, loss_sum=0.0), bytes(total))
        conn.send("sent")


async def _until_open(channel) -> None:
    if channel.readyState == "open":
        return
    opened = asyncio.Event()
    channel.on("open", opened.set)
    await opened.wait()


def _bench_cotrain(peers: int, rounds: int, numel: int, raw: bool) -> dict:
    from engine.backbone.server import Backbone, BackboneConfig
    from engine.project import ProjectSpec

    result: dict = {}

    async def run():
        spec = ProjectSpec(id="bench", title="bench", task="demo-lm")
        with tempfile.TemporaryDirectory() as tmp:
            backbone = Backbone(BackboneConfig(data_dir=Path(tmp)), [spec])
            url = await backbone.start()
            ctx = mp.get_context("spawn")
            pipes, procs = [], []
            for _ in range(peers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_cotrain_peer, args=(url, "bench", child, numel, rounds, numel * 4))
                proc.start()
                pipes.append(parent)
                procs.append(proc)
            loop = asyncio.get_running_loop()

            async def recv(pipe, timeout: float = 900):
                if not await loop.run_in_executor(None, pipe.poll, timeout):
                    raise TimeoutError("a benchmark peer stopped answering")
                return pipe.recv()

            ids = [await recv(p) for p in pipes]
            group = sorted(ids)
            for p in pipes:
                p.send(group)
            times = []
            for r in range(rounds):
                began = time.perf_counter()
                for p in pipes:
                    p.send("round")
                    p.send(1000 + r)
                for p in pipes:
                    assert await recv(p) == "done"
                times.append(time.perf_counter() - began)
            result["round_seconds"] = times
            if raw:
                for kind in ("raw", "framed"):
                    receiver, sender = pipes[0], pipes[1]
                    receiver.send(f"{kind}-recv")
                    assert await recv(receiver) == "listening"
                    began = time.perf_counter()
                    sender.send(f"{kind}-send")
                    assert await recv(receiver) == "done"
                    result[f"{kind}_seconds"] = time.perf_counter() - began
                    assert await recv(sender) == "sent"
            for p in pipes:
                p.send("stop")
            for proc in procs:
                await loop.run_in_executor(None, proc.join, 60)
            await backbone.stop()

    asyncio.run(run())
    return result


# --- gloo ---------------------------------------------------------------------------------

def _gloo_rank(rank: int, world: int, port: int, numel: int, rounds: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.randn(numel)
    dist.barrier()
    times = []
    for _ in range(rounds):
        dist.barrier()
        began = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - began)
    if rank == 0:
        queue.put(times)
    dist.destroy_process_group()


def _bench_gloo(world: int, rounds: int, numel: int) -> list[float]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, numel, rounds, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    times = queue.get(timeout=600)
    for p in procs:
        p.join(60)
    return times


def main(quick: bool = False) -> None:
    numel = NUMEL // 10 if quick else NUMEL
    rounds = 2 if quick else 3
    mb = numel * 4 / 1e6
    print(f"\n== Averaging {numel / 1e6:.1f}M fp32 ({mb:.0f} MB), loopback, one process per peer, "
          f"{os.cpu_count()} cores", flush=True)
    rows = []
    extra = {}
    for peers in (2, 4):
        ours = _bench_cotrain(peers, rounds, numel, raw=peers == 2)
        gloo = _bench_gloo(peers, rounds + 1, numel)[1:]
        extra.update({k: v for k, v in ours.items() if k != "round_seconds"})
        rows.append((peers, statistics.median(ours["round_seconds"]), statistics.median(gloo)))
    print(f"{'peers':>5} {'cotrain s':>10} {'gloo s':>8} {'cotrain/gloo':>13} {'MB/s per peer':>14}")
    for peers, ours, gloo in rows:
        moved = 2 * mb * (peers - 1) / peers  # sent and received by each peer
        print(f"{peers:>5} {ours:>10.2f} {gloo:>8.3f} {ours / gloo:>13.1f} {moved / ours:>14.1f}")
    raw, framed = extra["raw_seconds"], extra["framed_seconds"]
    print(f"one-way, 2 processes, {mb:.0f} MB: raw aiortc data channel {mb / raw:.1f} MB/s, "
          f"Cotrain framed link {mb / framed:.1f} MB/s (framing costs {framed / raw:.2f}x)")
    print(f"butterfly with 2 peers vs one raw one-way transfer of the same tensor: "
          f"{rows[0][1] / raw:.2f}x", flush=True)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
