"""DeDLOC's load balancing on unequal home links: four peers in network namespaces whose
cables are shaped with token buckets (40/40, 20/5 and 10/2 Mbit/s down/up, and a 40/40 peer
that reaches the others through TURN only), a model large enough that the links, not the
CPU, set the pace. The peers measure their links by themselves; the same collaboration runs
on a backbone that sizes parts with the LP, then on one that gives equal parts."""

from __future__ import annotations

import statistics

import pytest

from engine.averaging.load_balancing import Member, balance
from engine.tasks import create_task, initial_model
from tests.collab.harness import TINY, tiny_project
from tests.collab.processes import terminate, write_catalog
from tests.conftest import until
from tests.nat.services import spawn_peer_in

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PROJECT = "shaped-lm"
MBIT = 125_000.0
LINKS = {"fast": (40, 40), "mid": (20, 5), "slow": (10, 2), "relayed": (40, 40)}  # down, up
MODEL = dict(TINY, d_model=128, heads=4, ff=512, layers=3, micro_batch=2)
ROUNDS = 4  # timed rounds in which all four peers took part (after a first, connecting, one)


def vector_bytes() -> int:
    model = initial_model(create_task("demo-lm", dict(MODEL)), 0)
    return 4 * sum(p.numel() for p in model.parameters())


def predicted(nbytes: int) -> float:
    members = [Member(up * MBIT, down * MBIT, reduces=name != "relayed")
               for name, (down, up) in LINKS.items()]
    return balance(members, nbytes).seconds


async def round_seconds(network, tmp_path, port: int, *args: str) -> float:
    """The median time of ROUNDS full rounds, each as long as its slowest member's all-reduce
    and step (not counting the micro-batch a member finishes when the round opens)."""
    catalog = write_catalog(tmp_path / f"catalog-{port}.json", tiny_project(
        id=PROJECT, task_params=MODEL, target_batch_size=256, round_timeout=120))
    backbone, url = network.backbone(port, *args, catalog=catalog)
    peers = []
    try:
        for name, (down, up) in LINKS.items():
            host = network.topology.public_peer(upload_mbit=up, download_mbit=down)
            # Compute like a device 20 times slower: a step takes several seconds of it, so all
            # four are in the first round and none falls behind (a state download on these
            # links takes seconds too).
            extra = ["--slowdown", "20", *(["--relay-only"] if name == "relayed" else [])]
            peers.append(await spawn_peer_in(host, url, PROJECT, f"{name}-{port}", tmp_path, *extra))

        def full(peer) -> dict[int, float]:
            return {e["epoch"]: e["averaging_seconds"] for e in peer.epochs if e["peers"] == len(LINKS)}

        await until(lambda: len(set.intersection(*(set(full(p)) for p in peers))) > ROUNDS, 600,
                    f"{ROUNDS + 1} rounds with all four peers")
        epochs = sorted(set.intersection(*(set(full(p)) for p in peers)))[1:ROUNDS + 1]
        return statistics.median(max(full(p)[e] for p in peers) for e in epochs)
    finally:
        await terminate(*peers)
        backbone.stop()


async def test_lp_shares_end_rounds_as_predicted_and_beat_equal_shares(network, tmp_path, report_figure):
    nbytes = vector_bytes()
    expected = predicted(nbytes)
    lp = await round_seconds(network, tmp_path, 8491)
    equal = await round_seconds(network, tmp_path, 8492, "--equal-shares")
    report_figure(f"{nbytes / 1e6:.1f} MB vector: LP predicts {expected:.1f} s; measured {lp:.1f} s with the "
                  f"LP's shares ({lp / expected:.2f}x), {equal:.1f} s with equal shares "
                  f"({equal / lp:.2f}x slower)")
    # The LP's model is fluid: a reducer's results flowing out while parts still flow in.
    # Cotrain's rounds send a part's result once the whole part is in, and the data channel
    # adds ~7% of headers: measured here 1.25-1.29x the prediction, and equal shares
    # 1.51-1.59x slower. The bounds leave room for a shared machine.
    assert lp <= 1.4 * expected
    assert equal >= 1.35 * lp
