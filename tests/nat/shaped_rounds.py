"""The collaboration DeDLOC's load balancing is measured on: four peers in network
namespaces whose cables are shaped with token buckets (40/40, 20/5 and 10/2 Mbit/s down/up,
and a 40/40 peer that reaches the others through TURN only), optionally with an auxiliary
peer on a 100/100 Mbit/s link (`cotrain peer --aux`), a model large enough that the links,
not the CPU, set the pace. The peers measure their links by themselves. Used by
tests/nat/test_shaped_links.py and tests/bench/shaped_links.py."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from engine.planning.load_balancing import Member, balance, equal_shares, round_time
from engine.tasks import create_task, initial_model
from tests.collab.harness import TINY, tiny_project
from tests.collab.processes import terminate, write_catalog
from tests.conftest import until
from tests.nat.services import spawn_peer_in

PROJECT = "shaped-lm"
MBIT = 125_000.0
LINKS = {"fast": (40, 40), "mid": (20, 5), "slow": (10, 2), "relayed": (40, 40)}  # down, up
AUXILIARY = (100, 100)
MODEL = dict(TINY, d_model=192, heads=4, ff=768, layers=3, micro_batch=2)
ROUNDS = 4  # timed rounds in which all four peers took part (after a first, connecting, one)


def vector_bytes() -> int:
    model = initial_model(create_task("demo-lm", dict(MODEL)), 0)
    return 4 * sum(p.numel() for p in model.parameters())


def members(auxiliary: bool) -> list[Member]:
    links = [Member(up * MBIT, down * MBIT, reduces=name != "relayed") for name, (down, up) in LINKS.items()]
    if auxiliary:
        down, up = AUXILIARY
        links.append(Member(up * MBIT, down * MBIT, sends=False))
    return links


def predicted(nbytes: int, auxiliary: bool = False) -> float:
    return balance(members(auxiliary), nbytes).seconds


def predicted_gain(auxiliary: bool) -> float:
    """How much longer the LP expects equal shares to take."""
    links = members(auxiliary)
    return round_time(equal_shares(links), links, 1.0) / balance(links, 1.0).seconds


@dataclass
class Rounds:
    """The median of ROUNDS full rounds, measured two ways: the longest time a member spent
    in the round, from its own start (its gradient in hand) to its step -- an early starter
    also waits for late ones, as a member first finishes the micro-batch under way -- and
    from the last member's start to the last member's step, which credits the early
    starters' head start. The first bounds the round's transfer time from above, the second
    from below."""

    longest_member: float
    all_in: float


async def round_seconds(network, workdir, port: int, *args: str, auxiliary: bool = False) -> Rounds:
    catalog = write_catalog(workdir / f"catalog-{port}.json", tiny_project(
        id=PROJECT, task_params=MODEL, target_batch_size=128, round_timeout=120))
    backbone, url = network.backbone(port, *args, catalog=catalog)
    peers = []
    try:
        for name, (down, up) in LINKS.items():
            host = network.topology.public_peer(upload_mbit=up, download_mbit=down)
            # Compute like a device 20 times slower: a step takes several seconds of it, so all
            # four are in the first round and none falls behind (a state download on these
            # links takes seconds too).
            extra = ["--slowdown", "20", *(["--relay-only"] if name == "relayed" else [])]
            peers.append(await spawn_peer_in(host, url, PROJECT, f"{name}-{port}", workdir, *extra))
        helpers = []
        if auxiliary:
            down, up = AUXILIARY
            host = network.topology.public_peer(upload_mbit=up, download_mbit=down)
            helpers.append(await spawn_peer_in(host, url, PROJECT, f"aux-{port}", workdir, "--aux"))
        everyone = len(LINKS) + len(helpers)

        def full(peer) -> dict[int, tuple[float, float]]:
            return {e["epoch"]: (e["averaging_began"], e["averaging_began"] + e["averaging_seconds"])
                    for e in peer.epochs if e["peers"] == everyone}

        await until(lambda: len(set.intersection(*(set(full(p)) for p in peers))) > ROUNDS, 600,
                    f"{ROUNDS + 1} rounds with all {everyone} peers")
        epochs = sorted(set.intersection(*(set(full(p)) for p in peers)))[1:ROUNDS + 1]
        spans = [[full(p)[e] for p in peers] for e in epochs]
        longest = statistics.median(max(end - began for began, end in s) for s in spans)
        return Rounds(longest, statistics.median(max(e for _, e in s) - max(b for b, _ in s) for s in spans))
    finally:
        await terminate(*peers, *helpers)
        backbone.stop()
