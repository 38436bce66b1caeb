"""hivemind 1.1.12's all-reduce of the same tensor, for tests/bench/allreduce.py to run side by
side with Cotrain. It runs under hivemind's own interpreter (a separate venv: hivemind pins
old protobuf and pydantic), so it imports nothing of Cotrain and prints one JSON line:

    /path/to/hivemind-venv/bin/python tests/bench/hivemind_allreduce.py --peers 2 --numel 25000000

Set up once: python3 -m venv ~/hivemind-venv && ~/hivemind-venv/bin/pip install torch==2.13.0 hivemind==1.1.12
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant: hivemind averages in a child
    process and moves bytes in a Go daemon (p2pd), and both count."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        todo += children.get(current, [])
    return total


def _peer(rank: int, peers: int, numel: int, rounds: int, maddrs, conn) -> None:
    import hivemind
    import torch
    from hivemind.compression import NoCompression

    torch.set_num_threads(1)
    initial = maddrs.get() if rank else []
    dht = hivemind.DHT(start=True, initial_peers=initial, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    if rank == 0:
        for _ in range(peers - 1):
            maddrs.put([str(a) for a in dht.get_visible_maddrs()])
    tensor = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    averager = hivemind.averaging.DecentralizedAverager(
        [tensor], dht, prefix="bench", target_group_size=peers, min_group_size=peers,
        compression=NoCompression(), start=True)
    conn.send("ready")
    for _ in range(rounds):
        assert conn.recv() == "round"
        cpu = _tree_cpu(os.getpid())
        group = averager.step(timeout=600)
        assert group is not None and len(group) == peers, group
        conn.send(_tree_cpu(os.getpid()) - cpu)
    conn.recv()
    averager.shutdown()
    dht.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peers", type=int, default=2)
    parser.add_argument("--numel", type=int, default=25_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ctx = mp.get_context("fork")  # hivemind's own processes expect fork
    maddrs = ctx.Queue()
    pipes, procs = [], []
    for rank in range(args.peers):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_peer, args=(rank, args.peers, args.numel, args.rounds + 1, maddrs, child))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    for pipe in pipes:
        assert pipe.recv() == "ready"
    times, cpus = [], []
    for _ in range(args.rounds + 1):  # the first round warms up (connections, buffers)
        began = time.perf_counter()
        for pipe in pipes:
            pipe.send("round")
        cpu = sum(pipe.recv() for pipe in pipes)
        times.append(time.perf_counter() - began)
        cpus.append(cpu)
    for pipe in pipes:
        pipe.send("stop")
    for proc in procs:
        proc.join(60)
    times, cpus = times[1:], cpus[1:]
    print(json.dumps({"system": "hivemind-1.1.12", "peers": args.peers, "numel": args.numel,
                      "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                      "cpu_s": statistics.median(cpus)}), flush=True)


if __name__ == "__main__":
    main()
