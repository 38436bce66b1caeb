"""Who uploads the checkpoints, beside two honest `cotrain peer` processes: a peer claiming
the wire's fastest uplink that breaks every checkpoint it is asked for
(tests/hostile/checkpoint_shirker.py: bytes that are no state, or a state hash nobody
settled on), joining again as a new identity after each break,
and one with the same claim that delivers every checkpoint at a trickle
(tests/hostile/checkpoint_trickler.py). Before: the chore went to the fastest claim, and a
failed upload freed its peer at once, so the first was asked for every checkpoint and none
was ever stored (found in review, and tested then in the tracker alone); and the second
kept the chore for good, whatever its uploads showed."""

from __future__ import annotations

import pytest

from engine.wire.types import MAX_RATE
from tests.hostile.checkpoint_shirker import SHIRK
from tests.hostile.collaboration import Collaboration, HonestPeer, Process, hostile_project
from tests.hostile.cued import start_cued

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CHECKPOINT_EVERY = 4
IDENTITIES = 3
AFTER_TRICKLE = 3  # checkpoints stored after the trickler's, to see who got them


def epochs_logged(process: Process, words: str) -> list[int]:
    return [int(line.split(words, 1)[1].split()[0]) for line in process.tail(10**7).splitlines()
            if words in line]


def stored(collab: Collaboration) -> list[int]:
    assert collab.backbone is not None
    return epochs_logged(collab.backbone, "stored checkpoint of epoch ")


def broken(shirker: HonestPeer) -> list[int]:
    return epochs_logged(shirker, "broke the checkpoint of epoch ")


def stored_after(collab: Collaboration, epoch: int) -> list[int]:
    """The checkpoints the backbone stored after that of ``epoch`` (those asked for while
    it was on its way are stored meanwhile)."""
    kept = stored(collab)
    return kept[kept.index(epoch) + 1:] if epoch in kept else []


def trickled(trickler: HonestPeer) -> list[int]:
    return epochs_logged(trickler, "trickling the checkpoint of epoch ")


@pytest.mark.parametrize("shirk", ["bytes", "state"])
async def test_a_fast_claim_that_breaks_its_checkpoints_costs_one_each_time_it_joins(
        tmp_path, monkeypatch, report_figure, shirk):
    # (A wrong state hash was refused before its bytes, and kept the chore owed for the
    # five minutes of its patience: the next checkpoint came an interval later.)
    monkeypatch.setenv(SHIRK, shirk)  # (the shirker inherits it)
    collab = Collaboration(tmp_path, project=hostile_project(checkpoint_every=CHECKPOINT_EVERY), peers=2,
                           backbone_args=("-v",))  # (its log names each checkpoint stored)
    collab.start_backbone()
    honest = [collab.start_peer(f"honest-{i}", "--data-seed", str(i)) for i in range(2)]
    shirkers: list[HonestPeer] = []
    try:
        for identity in range(IDENTITIES):
            shirker = await start_cued(collab, "tests.hostile.checkpoint_shirker", honest,
                                       name=f"shirker-{identity}")
            shirkers.append(shirker)
            await collab.until(lambda: broken(shirker), 120, f"{shirker.name} asked for a checkpoint")  # noqa: B023
            first = broken(shirker)[0]
            # The chore passes to an honest peer while the shirker is still a member.
            await collab.until(lambda: any(e > first for e in stored(collab)), 60,  # noqa: B023
                               f"a checkpoint stored after the one {shirker.name} broke")
            shirker.stop()  # ... and it comes back as a stranger with a clean record
            collab.peers.remove(shirker)
        last_epoch = collab.epoch
        assert all(p.alive for p in collab.processes())
    finally:
        collab.stop()
    breaks = [broken(s) for s in shirkers]
    kept = stored(collab)
    report_figure(f"a peer claiming a {MAX_RATE:.0e} B/s uplink that breaks every checkpoint ({shirk}), "
                  f"{IDENTITIES} identities in turn: it broke those of epochs {breaks}; the backbone "
                  f"stored those of epochs {kept}")
    for epochs in breaks:
        # Its claim buys the chore once; then it ranks behind every voter that delivers (a
        # second only while both honest peers were still uploading one each).
        assert 1 <= len(epochs) <= 2, breaks
        # Each break delays the collaboration's checkpoint by a round or so: the next
        # round's peer is asked at once, not the one due an interval after the broken one.
        assert any(0 < e - epochs[0] < CHECKPOINT_EVERY for e in kept), (epochs, kept)
    for epoch in range(1, last_epoch + 1):
        hashes = {e["state_sha256"] for p in honest for e in p.epochs if e["epoch"] == epoch}
        assert len(hashes) <= 1, f"epoch {epoch}: the honest peers' states differ"


async def test_a_fast_claim_that_delivers_at_a_trickle_is_not_asked_again(tmp_path, report_figure):
    collab = Collaboration(tmp_path, project=hostile_project(checkpoint_every=CHECKPOINT_EVERY), peers=2,
                           backbone_args=("-v",))
    collab.start_backbone()
    honest = [collab.start_peer(f"honest-{i}", "--data-seed", str(i)) for i in range(2)]
    try:
        trickler = await start_cued(collab, "tests.hostile.checkpoint_trickler", honest, name="trickler")
        await collab.until(lambda: trickled(trickler), 120, "the trickler asked for a checkpoint")
        first = trickled(trickler)[0]
        await collab.until(lambda: len(stored_after(collab, first)) >= AFTER_TRICKLE, 180,
                           f"{AFTER_TRICKLE} checkpoints stored after the trickler's")
        assert all(p.alive for p in collab.processes())
    finally:
        collab.stop()
    asked, kept = trickled(trickler), stored(collab)
    report_figure(f"a peer claiming a {MAX_RATE:.0e} B/s uplink that uploads at 20 kB/s: asked for the "
                  f"checkpoints of epochs {asked}; the backbone stored those of epochs {kept}")
    # Its claim bought one chore; the rate its upload showed ranks it behind the honest
    # peers' for every one asked for since (while the chore went by claims, it took the
    # next each time it was free).
    assert asked == [first], (asked, kept)
    assert all(e > first for e in stored_after(collab, first)), kept
