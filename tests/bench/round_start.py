"""How soon a round's first byte leaves after its RoundStart reaches a peer, on a warm mesh:
a backbone and three `cotrain peer` processes on loopback, then a fourth that joins late.
Each peer times, per round, its gradient in hand (the micro-batch under way finished:
synchronous training waits for it) and its first part handed to its link; set-up is the
time between the two (telling the backbone what it brings, the plan, the links, the first
part's bytes). Peers then join late, one at a time, each killed after its first rounds:
the first round of those that linked to their partners when they became ready, and of as
many the backbone did not tell their partners (they dial them all at their RoundStart, as
every joiner did before).

    python -m tests.bench.round_start [--quick]

Rounds on loopback with 1 compute thread per peer on 2 shared cores: the figures include
the wait for a core, which a volunteer's own machine does not have.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

from engine.backbone.tracker import Send
from engine.wire.control import Partners
from tests.collab.harness import TINY, running_backbone, tiny_project
from tests.collab.processes import PeerProcess, spawn_peer, terminate
from tests.conftest import until

PEERS = 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def line(what: str, values: list[float]) -> str:
    if not values:
        return f"{what:<44} (none)"
    ms = [v * 1000 for v in values]
    return (f"{what:<44} median {statistics.median(ms):7.1f} ms   p95 {percentile(ms, 0.95):7.1f} ms   "
            f"max {max(ms):7.1f} ms   ({len(ms)} rounds)")


def withhold_partners(backbone, name: str) -> None:
    """The backbone does not tell peer ``name`` whom to link to: its first round dials them
    all at its RoundStart, as every round did before links were set up ahead."""
    carry_out, tracker = backbone.execute, next(iter(backbone.trackers.values()))

    def execute(project_id, outs):
        carry_out(project_id, [o for o in outs if not (
            isinstance(o, Send) and isinstance(o.msg, Partners)
            and getattr(tracker.members.get(o.to), "name", None) == name)])

    backbone.execute = execute


async def run(epochs: int, micro_batch: int, joiners: int) -> tuple[list[dict], list[dict], list[dict]]:
    """Epoch lines of the first peers' rounds after their first, then the first rounds of
    ``joiners`` late joiners told their partners and as many not told (each leaves, killed,
    before the next joins)."""
    project = tiny_project(task_params=dict(TINY, micro_batch=micro_batch),
                           target_batch_size=16 * micro_batch, round_timeout=20, checkpoint_every=10**6)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        async with running_backbone(where / "data", project) as backbone:
            peers: list[PeerProcess] = []
            try:
                peers += [await spawn_peer(backbone.url, project.id, f"p{i}", where) for i in range(PEERS)]
                await until(lambda: all(p.epoch >= epochs for p in peers), 60 + 2 * epochs,
                            f"{PEERS} peers at epoch {epochs}")
                joined_at = max(p.epoch for p in peers)
                withhold_partners(backbone, "cold")
                for i in range(joiners):
                    for name in ("told", "cold"):
                        joiner = await spawn_peer(backbone.url, project.id, name, where)
                        peers.append(joiner)
                        await until(lambda: len(joiner.epochs) >= 3, 120,  # noqa: B023
                                    f"{name} {i}'s first rounds")
                        joiner.kill()
            finally:
                await terminate(*peers)
    warm = [e for p in peers[:PEERS] for e in p.epochs[1:] if e["epoch"] <= joined_at]
    return (warm, [e for p in peers[PEERS::2] for e in p.epochs[:1]],
            [e for p in peers[PEERS + 1::2] for e in p.epochs[:1]])


def main(quick: bool) -> None:
    epochs, joiners = (15, 1) if quick else (60, 5)
    for micro_batch in (4, 32):
        warm, told, cold = asyncio.run(run(epochs, micro_batch, joiners))
        print(f"\n== Round start to first byte: {PEERS} peers (tiny demo-lm, micro-batch {micro_batch}), "
              f"loopback, rounds 2-{epochs} of each peer", flush=True)
        sent = [e for e in warm if e["first_byte_seconds"] is not None]
        print(line("gradient in hand (the micro-batch under way)", [e["took_seconds"] for e in warm]))
        print(line("set-up (gradient in hand to first byte)",
                   [e["first_byte_seconds"] - e["took_seconds"] for e in sent]))
        print(line("RoundStart to first byte", [e["first_byte_seconds"] for e in sent]))
        for what, joiner in (("a joiner's first round, links set up ahead", told),
                             ("the same, links set up at its RoundStart", cold)):
            print(line(what, [e["first_byte_seconds"] for e in joiner
                              if e["first_byte_seconds"] is not None]))


if __name__ == "__main__":
    main("--quick" in sys.argv[1:])
