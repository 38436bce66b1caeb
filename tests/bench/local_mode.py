"""Sync vs local mode (DiLoCo) on home links: three peers in network namespaces, each on a
cable shaped to 10 Mbit/s both ways, the same model, data and wall-clock budget. For each
mode: the bytes the peers' links sent to each other per sample the collaboration trained on
(counted on the links, from the first settled step on), the same with what they sent the
backbone too (control plane, link probes, a checkpoint every step), the steps taken, and
the held-out loss of the last settled state when the budget ran out. That checkpoint, there
for the measure, would take each step's uploader's link for seconds, and sync takes more
steps: traffic to the backbone's machine bypasses the shaping.

    sudo python -m tests.bench.local_mode [--quick]

Sync averages the gradient of at least 96 samples (32 per peer; more arrive while a round
is under way); local mode takes an inner step every 32 samples on each peer and an outer
step every 50 or 200 inner steps per peer (H), its pseudo-gradients in fp32 and, as
INTELLECT-1 sent them, in 8 bits.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.averaging.powersgd import warm_shapes_of
from engine.project import CompressionMethod, LocalSpec, OptimizerSpec, ProjectSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import collaboration_optimizer
from engine.training.params import trainable
from engine.training.state import load_state, warm_slots
from engine.wire.tensors import decode_file
from tests.collab.harness import TINY, tiny_project
from tests.collab.processes import PeerProcess, terminate, write_catalog
from tests.conftest import until
from tests.nat.network import nat_network
from tests.nat.services import spawn_peer_in
from tests.nat.topology import Host, missing_requirements

PEERS = 3
LINK_MBIT = 10
MODEL = dict(TINY, d_model=192, heads=4, ff=768, layers=3, micro_batch=4)
INNER_BATCH = 32  # per peer: sync's batch is PEERS of these
HELD_OUT = 16  # batches no peer trains on


@dataclass
class Outcome:
    mode: str
    steps: int
    samples: int  # trained on in the steps after the first
    to_peers: int  # bytes all peers' links sent each other over those steps
    in_all: int  # ... and to the backbone
    loss: float  # held-out, of the last settled state

    def per_sample(self, nbytes: int) -> float:
        return nbytes / max(self.samples, 1)


def project(inner_steps: int | None, compression: CompressionMethod = "none") -> ProjectSpec:
    optimizer = OptimizerSpec(name="adamw", lr=3e-3, clip_grad_norm=1.0)
    common = dict(id="home-lm", task_params=MODEL, optimizer=optimizer, compression=compression,
                  round_timeout=120,
                  checkpoint_every=1, keep_checkpoints=2,
                  schedule=ScheduleSpec(type="constant", warmup_epochs=0, total_epochs=10**6))
    if inner_steps is None:
        return tiny_project(**common, target_batch_size=PEERS * INNER_BATCH)
    return tiny_project(**common, mode="local", target_batch_size=PEERS * INNER_BATCH * inner_steps,
                        local=LocalSpec(inner_batch_size=INNER_BATCH, outer_lr=0.7, outer_momentum=0.9))


def count_to(host: Host, server: str) -> None:
    """Count what ``host`` sends ``server`` (an accepting rule's byte counter), and let it
    bypass the uplink's token bucket: an HTB class at 1 Gbit/s for the server, the shaped
    one for the rest (this kernel has no prio qdisc)."""
    host.run("iptables", "-I", "OUTPUT", "1", "-d", server, "-j", "ACCEPT")
    tc = ["tc", "class", "add", "dev", "eth0", "parent", "1:"]
    host.run("tc", "qdisc", "del", "dev", "eth0", "root")
    host.run("tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "20",
             "r2q", "1000")
    host.run(*tc, "classid", "1:10", "htb", "rate", "1gbit")
    host.run(*tc, "classid", "1:20", "htb", "rate", f"{LINK_MBIT}mbit", "ceil", f"{LINK_MBIT}mbit",
             "burst", "32kb")
    host.run("tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32", "match", "ip",
             "dst", f"{server}/32", "flowid", "1:10")


def sent_bytes(host: Host, server: str) -> tuple[int, int]:
    """(to anyone, to ``server``): what the machine's cable carried out (not what went into
    a delay line's TUN device on its way there: tests/nat/delay_line.py)."""
    total = 0
    for line in host.run("cat", "/proc/net/dev").splitlines()[2:]:
        name, counters = line.split(":", 1)
        if name.strip() != "lo" and not name.strip().startswith("dly"):
            total += int(counters.split()[8])
    rules = host.run("iptables", "-L", "OUTPUT", "-n", "-v", "-x").splitlines()[2:]
    to_server = sum(int(r.split()[1]) for r in rules if r.split()[8] == server)  # its destination
    return total, to_server


def held_out_loss(files: Iterable[Path], spec: ProjectSpec) -> tuple[int, float]:
    """(epoch, loss) of the newest of these state files (checkpoints, or what peers saved as
    they left: the same format)."""
    newest = None
    for path in files:  # (one state in memory at a time, and the newest)
        state = decode_file(path.read_bytes())
        if newest is None or state.index.meta.epoch > newest.index.meta.epoch:
            newest = state
    assert newest is not None, "no state file"
    task = create_task(spec.task, dict(spec.task_params))
    model = initial_model(task, spec.seed)
    optimizer = collaboration_optimizer(spec, model)
    warm = warm_slots(optimizer, trainable(model), warm_shapes_of(spec, trainable(model)))
    epoch = load_state(newest, model, optimizer, spec.id, warm)
    with torch.no_grad():
        loss = statistics.mean(float(task.loss(model, task.batch(10**6, i))) for i in range(HELD_OUT))
    return epoch, loss


async def run(net, workdir: Path, label: str, spec: ProjectSpec, port: int, budget: float) -> Outcome:
    catalog = write_catalog(workdir / f"catalog-{port}.json", spec)
    backbone, url = net.backbone(port, catalog=catalog)
    hosts = [net.topology.public_peer(upload_mbit=LINK_MBIT, download_mbit=LINK_MBIT) for _ in range(PEERS)]
    server = net.public.address  # the backbone's (and the relay's, which these public peers do not need)
    for host in hosts:
        count_to(host, server)
    peers: list[PeerProcess] = []
    began = time.monotonic()
    try:
        for i, host in enumerate(hosts):
            name = f"{label.replace(' ', '').replace('=', '')}-{i}"
            peers.append(await spawn_peer_in(host, url, spec.id, name, workdir, "--data-seed", str(i)))
        await until(lambda: any(p.epochs for p in peers), budget, f"{label}: a first settled step")
        first = max(p.epoch for p in peers)
        before = [sent_bytes(h, server) for h in hosts]
        await asyncio.sleep(max(budget - (time.monotonic() - began), 0))  # the budget is the measure
        after = [sent_bytes(h, server) for h in hosts]
    finally:
        await terminate(*peers)
        backbone.stop()
    steps = {e["epoch"]: e["samples"] for p in peers for e in p.epochs}
    epoch, loss = held_out_loss((workdir / f"backbone-{port}").glob("**/*.ckpt"), spec)
    in_all = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    to_server = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    samples = sum(s for e, s in steps.items() if e > first)
    return Outcome(label, epoch, samples, in_all - to_server, in_all, loss)


async def measure(net, workdir: Path, budget: float) -> list[Outcome]:
    modes = [("sync", project(None)), ("local H=50", project(50)), ("local H=200", project(200)),
             ("local H=50 uint8", project(50, "uint8"))]
    return [await run(net, workdir, label, spec, 8500 + i, budget) for i, (label, spec) in enumerate(modes)]


def main(quick: bool = False) -> None:
    budget = 200.0 if quick else 400.0
    print(f"\n== Sync vs local mode: {PEERS} peers on {LINK_MBIT} Mbit/s links, {budget:.0f} s each")
    missing = missing_requirements()
    if missing:
        print(f"skipped: {missing}")
        return
    with tempfile.TemporaryDirectory(prefix="cotrain-bench-local-") as tmp, nat_network(Path(tmp)) as net:
        outcomes = asyncio.run(measure(net, Path(tmp), budget))
    sync = outcomes[0]
    print(f"{'mode':<18}{'steps':>6}{'samples':>9}{'B/sample to peers':>19}{'vs sync':>9}"
          f"{'B/sample in all':>17}{'vs sync':>9}{'held-out loss':>15}")
    for o in outcomes:
        peers, in_all = o.per_sample(o.to_peers), o.per_sample(o.in_all)
        gain, gain_all = sync.per_sample(sync.to_peers) / peers, sync.per_sample(sync.in_all) / in_all
        print(f"{o.mode:<18}{o.steps:>6}{o.samples:>9}{peers:>19,.0f}{gain:>8.1f}x"
              f"{in_all:>17,.0f}{gain_all:>8.1f}x{o.loss:>15.3f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
