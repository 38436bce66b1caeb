"""Averaging a 25M-element fp32 gradient (100 MB) on loopback, each peer its own process:
Cotrain's butterfly all-reduce on each WebRTC stack, torch.distributed's gloo all_reduce
(the physical floor) and, given its interpreter, hivemind 1.1.12's all-reduce -- in one run.

    python -m tests.bench.allreduce --peers 2 [--json] [--numel N] [--rounds R]
        [--hivemind ~/hivemind-venv/bin/python]

Prints, per system, the median, least and most seconds per round and the CPU seconds one
round costs all peers together (native threads and helper processes included); with
--json, one JSON line per system. hivemind pins old protobuf and pydantic, so it runs from
its own venv (tests/bench/hivemind_allreduce.py says how to make one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from engine.backbone.tracker.scheduling import PIECES, PIPELINE_FROM
from tests.bench import stack_floor

NUMEL = 25_000_000
HIVEMIND_SCRIPT = Path(__file__).with_name("hivemind_allreduce.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Cotrain peers ------------------------------------------------------------------------

def _cotrain_peer(url: str, project: str, conn, numel: int, transport: str, pieces: int) -> None:
    import logging

    os.environ["COTRAIN_TRANSPORT"] = transport
    from engine import aio

    # Warnings say why a round failed; COTRAIN_BENCH_LOG=INFO (or DEBUG) says more.
    logging.basicConfig(level=os.environ.get("COTRAIN_BENCH_LOG", "WARNING"),
                        format="%(asctime)s %(process)d %(name)s: %(message)s")

    aio.run(_cotrain_peer_main(url, project, conn, numel, pieces))


async def _cotrain_peer_main(url, project, conn, numel, pieces) -> None:
    import torch

    from engine.aio import spawn
    from engine.averaging.allreduce import butterfly_allreduce
    from engine.averaging.round_plan import RoundPlan
    from engine.peer.client import ControlClient
    from engine.transport.backends import restrict_host_addresses
    from engine.transport.ice import ice_configuration
    from engine.transport.mailbox import Mailbox
    from engine.transport.mesh import PeerMesh
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
        plan = RoundPlan(command, 0, group, [1.0] * len(group), me, pieces=pieces)
        cpu = time.process_time()
        await butterfly_allreduce(plan, vector, 1, 0.0, mesh, timeout=900)
        conn.send(time.process_time() - cpu)
    dispatcher.cancel()
    await mesh.close()
    await client.close()


def _bench_cotrain(peers: int, rounds: int, numel: int, transport: str,
                   pieces: int) -> tuple[list[float], list[float]]:
    """Seconds per round and CPU seconds per round (all peers), after a warm-up round."""
    from engine.backbone.server import Backbone, BackboneConfig
    from engine.project import ProjectSpec

    times: list[float] = []
    cpus: list[float] = []

    async def run():
        spec = ProjectSpec(id="bench", title="bench", task="demo-lm")
        with tempfile.TemporaryDirectory() as tmp:
            backbone = Backbone(BackboneConfig(data_dir=Path(tmp)), [spec])
            url = await backbone.start()
            ctx = mp.get_context("spawn")
            pipes, procs = [], []
            for _ in range(peers):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_cotrain_peer, args=(url, "bench", child, numel, transport, pieces))
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
            for r in range(rounds + 1):
                began = time.perf_counter()
                for p in pipes:
                    p.send(1000 + r)
                cpu = sum([await recv(p) for p in pipes])
                times.append(time.perf_counter() - began)
                cpus.append(cpu)
            for p in pipes:
                p.send("stop")
            for proc in procs:
                await loop.run_in_executor(None, proc.join, 60)
            await backbone.stop()

    asyncio.run(run())
    return times[1:], cpus[1:]


# --- gloo ---------------------------------------------------------------------------------

def _gloo_rank(rank: int, world: int, port: int, numel: int, rounds: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tensor = torch.randn(numel)
    dist.barrier()
    times, cpus = [], []
    for _ in range(rounds):
        dist.barrier()
        began, cpu = time.perf_counter(), time.process_time()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - began)
        cpus.append(time.process_time() - cpu)
    queue.put((rank, times, cpus))
    dist.destroy_process_group()


def _bench_gloo(world: int, rounds: int, numel: int) -> tuple[list[float], list[float]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_rank, args=(r, world, port, numel, rounds, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    ranks = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    times = [max(r[1][i] for r in ranks) for i in range(rounds)]
    cpus = [sum(r[2][i] for r in ranks) for i in range(rounds)]
    return times[1:], cpus[1:]


def _row(system: str, peers: int, numel: int, times: list[float], cpus: list[float]) -> dict:
    return {"system": system, "peers": peers, "numel": numel, "median_s": statistics.median(times),
            "min_s": min(times), "max_s": max(times), "cpu_s": statistics.median(cpus)}


def _bench_hivemind(python: str, peers: int, numel: int, rounds: int) -> dict:
    out = subprocess.run([python, str(HIVEMIND_SCRIPT), "--peers", str(peers), "--numel", str(numel),
                          "--rounds", str(rounds)], capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--numel", type=int, default=NUMEL)
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds, after one warm-up")
    parser.add_argument("--json", action="store_true", help="one JSON line per system")
    parser.add_argument("--systems", default="floor-native,native,aiortc,gloo",
                        help="comma-separated, from native, aiortc, gloo, floor-native, floor-aiortc "
                             "(a round's bytes over the bare stack: tests/bench/stack_floor.py; "
                             "default: all but floor-aiortc)")
    parser.add_argument("--hivemind", metavar="PYTHON",
                        help="hivemind 1.1.12's interpreter: adds it to the run")
    parser.add_argument("--pieces", type=int, default=PIECES,
                        help=f"parts per share, pipelined (default {PIECES}: what the backbone asks of a "
                             f"round it expects to take {PIPELINE_FROM:.0f} s or more)")
    parser.add_argument("--quick", action="store_true", help="a tenth of the tensor, two rounds")
    args = parser.parse_args()
    if args.quick:
        args.numel, args.rounds = args.numel // 10, 2
    rows = []
    for system in args.systems.split(","):
        if system == "gloo":
            times, cpus = _bench_gloo(args.peers, args.rounds + 1, args.numel)
            rows.append(_row("gloo", args.peers, args.numel, times, cpus))
        elif system.startswith("floor-"):
            stack = system.removeprefix("floor-")
            times, cpus = stack_floor.bench(args.peers, args.rounds, args.numel, stack)
            rows.append(_row(system, args.peers, args.numel, times, cpus))
        else:
            times, cpus = _bench_cotrain(args.peers, args.rounds, args.numel, system, args.pieces)
            rows.append(_row(f"cotrain-{system}", args.peers, args.numel, times, cpus))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    if args.hivemind:
        rows.append(_bench_hivemind(args.hivemind, args.peers, args.numel, args.rounds))
        if args.json:
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        return
    mb = args.numel * 4 / 1e6
    print(f"\n== Averaging {args.numel / 1e6:.1f}M fp32 ({mb:.0f} MB), {args.peers} peers, loopback, "
          f"one process per peer, {os.cpu_count()} cores, {args.rounds} rounds after a warm-up")
    print(f"{'system':>16} {'median s':>9} {'min s':>7} {'max s':>7} {'CPU s':>7}")
    for row in rows:
        print(f"{row['system']:>16} {row['median_s']:>9.2f} {row['min_s']:>7.2f} {row['max_s']:>7.2f} "
              f"{row['cpu_s']:>7.2f}")
    by = {row["system"]: row for row in rows}
    for base in ("gloo", "hivemind-1.1.12", "cotrain-aiortc", "floor-native", "floor-aiortc"):
        for system in ("cotrain-native", "cotrain-aiortc"):
            if base in by and system in by and system != base:
                print(f"{system} / {base}: {by[system]['median_s'] / by[base]['median_s']:.2f}x time, "
                      f"{by[system]['cpu_s'] / by[base]['cpu_s']:.2f}x CPU")


if __name__ == "__main__":
    main()
