"""The stack's own floor for a butterfly round: the bytes a round moves, over bare connections.

Each of N processes opens one connection to every other (through engine/transport/backends,
signaled through the parent), then per round sends each other peer its 1/N of the vector in
256 KiB messages and waits for the same from each, twice (reduce, then gather) -- no framing,
no checks, no reduction. What Cotrain's all-reduce adds on the same stack is the difference
to this row (``python -m tests.bench.allreduce --systems floor-native,native``).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time

from engine.transport.link import HIGH_WATER, LOW_WATER

MESSAGE = 256 * 1024


def _peer(rank: int, peers: int, numel: int, transport: str, conn) -> None:
    from engine import aio

    aio.run(_peer_main(rank, peers, numel, transport, conn))


async def _peer_main(rank: int, peers: int, numel: int, transport: str, conn) -> None:
    from engine.transport.backends import connect, restrict_host_addresses
    from engine.transport.ice import IceSettings
    from engine.wire.types import Transport

    restrict_host_addresses(["127.0.0.1"])
    loop = asyncio.get_running_loop()
    recv = lambda: loop.run_in_executor(None, conn.recv)  # noqa: E731
    share = numel * 4 // peers
    payload = memoryview(bytes(share))
    arrived = {j: 0 for j in range(peers) if j != rank}
    progress = asyncio.Event()
    links, drained = {}, {}
    for j in arrived:
        link = connect(Transport(transport), IceSettings([], False))

        def on_message(message: bytes, j: int = j) -> None:
            arrived[j] += len(message)
            progress.set()

        drained[j] = asyncio.Event()
        link.on_message, link.on_drained = on_message, drained[j].set
        link.set_low_water(LOW_WATER)
        links[j] = link
    # Signaling: the lower rank offers; the parent carries each SDP to its addressee.
    for j, link in links.items():
        if rank < j:
            conn.send(("offer", rank, j, await link.offer()))
    for _ in links:
        kind, sender, _, sdp = await recv()
        if kind == "offer":
            conn.send(("answer", rank, sender, await links[sender].answer(sdp)))
        else:
            await links[sender].accept(sdp)
    await asyncio.gather(*(link.opened() for link in links.values()))
    conn.send(("ready", rank, -1, ""))

    async def send_all(j: int) -> None:
        link = links[j]
        for offset in range(0, share, MESSAGE):
            while link.buffered_amount > HIGH_WATER:
                drained[j].clear()
                if link.buffered_amount > HIGH_WATER:
                    await drained[j].wait()
            link.send(payload[offset:offset + MESSAGE])

    async def phase(expected: int) -> None:
        sends = asyncio.gather(*(send_all(j) for j in links))
        while any(n < expected for n in arrived.values()):
            progress.clear()
            await progress.wait()
        await sends

    rounds = 0
    while await recv() != "stop":
        cpu = time.process_time()
        rounds += 1
        await phase(2 * rounds * share - share)
        await phase(2 * rounds * share)
        conn.send(time.process_time() - cpu)
    for link in links.values():
        await link.close()


def bench(peers: int, rounds: int, numel: int, transport: str) -> tuple[list[float], list[float]]:
    """Seconds and CPU seconds (all peers) per round, after a warm-up round."""
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for rank in range(peers):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_peer, args=(rank, peers, numel, transport, child))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    ready = 0
    while ready < peers:
        for pipe in pipes:
            if pipe.poll(0.05):
                kind, sender, to, sdp = pipe.recv()
                if kind == "ready":
                    ready += 1
                else:
                    pipes[to].send((kind, sender, to, sdp))
    times, cpus = [], []
    for _ in range(rounds + 1):
        began = time.perf_counter()
        for pipe in pipes:
            pipe.send("go")
        cpus.append(sum(pipe.recv() for pipe in pipes))
        times.append(time.perf_counter() - began)
    for pipe in pipes:
        pipe.send("stop")
    for proc in procs:
        proc.join(60)
    return times[1:], cpus[1:]
