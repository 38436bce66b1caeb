"""Peers come and go: slow ones, late ones, and a collaboration that everyone left."""

import time

import pytest

from engine.backbone.checkpoints import GRACE
from engine.peer.events import EpochCompleted, RoundFailed, Synced, SyncProgress
from tests.collab.harness import MEDIUM, running_backbone, start_peer, stop_all, tiny_project
from tests.conftest import until

pytestmark = pytest.mark.slow



async def test_a_slow_peer_contributes_proportionally_less_and_is_not_waited_for(tmp_path):
    project = tiny_project(task_params=MEDIUM, target_batch_size=480)
    epochs = 6
    async with running_backbone(tmp_path, project) as backbone:
        fast = [start_peer(backbone.url, project.id, f"fast{i}", max_epochs=epochs, threads=1)
                for i in range(2)]
        slow = start_peer(backbone.url, project.id, "slow", max_epochs=epochs, threads=1, slowdown=3.0)
        try:
            for p in (*fast, slow):
                assert await p.finish(timeout=240) == f"reached epoch {epochs}"
        finally:
            await stop_all(*fast, slow)
    # Count only epochs all three took part in (the first may close before everyone joined).
    shared = set.intersection(*({r.step.epoch for r in p.history if r.step.peers == 3}
                                for p in (*fast, slow)))
    assert len(shared) >= 3, shared
    mine = {p.peer.options.name: sum(r.my_samples for r in p.history if r.step.epoch in shared)
            for p in (*fast, slow)}
    ratio = mine["slow"] / ((mine["fast0"] + mine["fast1"]) / 2)
    assert 0.1 <= ratio <= 0.6, mine
    for r in slow.history:
        assert r.step.samples >= project.target_batch_size
        assert r.step.round_seconds < project.round_timeout / 2


async def test_a_device_slower_than_the_round_timeout_never_holds_a_round_up(tmp_path):
    # Its micro-batches take ~20 s: longer than the share of the round timeout a round may
    # wait for one (4 s here), and longer than the backbone's 15 s silence limit. (With a
    # 2-s share, a fast peer on a loaded machine once finished no micro-batch in it: its
    # half was then a lone part, set aside by design, and that round failed.)
    project = tiny_project(task_params=MEDIUM, target_batch_size=240, round_timeout=20)
    async with running_backbone(tmp_path, project) as backbone:
        fast = [start_peer(backbone.url, project.id, f"fast{i}", threads=1) for i in range(2)]
        crawler = start_peer(backbone.url, project.id, "crawler", threads=1, slowdown=1500.0)
        try:
            await until(lambda: crawler.synced() or crawler.task.done(), 60, "the slow device to sync")
            joined = crawler.times[crawler.events.index(crawler.synced()[0])]
            await until(lambda: crawler.times[-1] - joined > 25 or crawler.task.done(), 60,
                        "25 s of training with the slow device")
        finally:
            await stop_all(*fast, crawler)
    first = crawler.synced()[0].epoch
    by_epoch = {r.step.epoch: r for r in fast[0].history}
    taken = [r for r in crawler.history if r.step.epoch > first and r.step.epoch in by_epoch]
    assert len(taken) >= 10, "the slow device was left out of rounds"
    assert all(by_epoch[r.step.epoch].step.peers == 3 for r in taken)
    assert all(r.step.state_sha256 == by_epoch[r.step.epoch].step.state_sha256 for r in taken)
    # A round waits at most its share of the timeout for the slow micro-batch, and once
    # the device is known to be that slow, not at all.
    waits = sorted(by_epoch[r.step.epoch].step.round_seconds for r in taken)
    budget = 0.2 * project.round_timeout
    assert waits[-1] < budget + 1 and waits[-2] < budget / 2, waits
    assert not [e for p in fast for e in p.events if isinstance(e, RoundFailed)]


async def test_a_late_joiner_downloads_the_state_and_matches_from_its_first_epoch(tmp_path):
    project = tiny_project()
    async with running_backbone(tmp_path, project) as backbone:
        first = [start_peer(backbone.url, project.id, f"early{i}") for i in range(2)]
        late = None
        try:
            await first[0].reached(3, timeout=60)
            late = start_peer(backbone.url, project.id, "late")
            await until(lambda: late.synced() or late.task.done(), 60, "the late peer to sync")
            # On a loaded machine the others may settle a step while its download is under
            # way: it then fetches that one too. Either way it takes three steps with them.
            await until(lambda: len(late.history) >= 3 or late.task.done(), 60,
                        "three steps of the late peer")
            for p in first:  # they finish that same step a moment later
                await p.reached(late.history[-1].step.epoch, timeout=30)
        finally:
            await stop_all(*first, *([late] if late else []))
        completed = [e for e in late.events if isinstance(e, EpochCompleted)]
    (synced, *_) = late.synced()
    assert synced.source.startswith("peer") and synced.epoch >= 3
    first_sync = late.events.index(synced)
    progress = [e for e in late.events[:first_sync] if isinstance(e, SyncProgress) and e.total]
    assert progress[-1].received == progress[-1].total > 0
    assert [e.received for e in progress] == sorted(e.received for e in progress)
    # Its first step is the one right after the state it last downloaded: no step skipped.
    before_first = [e for e in late.events[:late.events.index(completed[0])] if isinstance(e, Synced)]
    assert len(completed) >= 3 and completed[0].step.epoch == before_first[-1].epoch + 1, (
        [(s.epoch, s.source) for s in late.synced()], [r.step.epoch for r in completed])
    # The same parameters as each of the others after every step it took with them.
    theirs = [{r.step.epoch: r.step.state_sha256 for r in p.history} for p in first]
    for r in completed:
        others = [hashes[r.step.epoch] for hashes in theirs if r.step.epoch in hashes]
        assert r.step.peers == 3 and others and set(others) == {r.step.state_sha256}, r.step.epoch


async def test_when_everyone_left_the_next_peer_resumes_from_the_latest_checkpoint(tmp_path):
    project = tiny_project(checkpoint_every=1, keep_checkpoints=2)
    async with running_backbone(tmp_path, project) as backbone:
        peers = [start_peer(backbone.url, project.id, f"p{i}", max_epochs=4) for i in range(2)]
        try:
            for p in peers:
                assert await p.finish(timeout=120) == "reached epoch 4"
        finally:
            await stop_all(*peers)
        saved = backbone.store.checkpoints.listed(project.id)
        assert [info.epoch for info in saved] == [4, 3]  # one per epoch, the last two kept
        on_disk = set(backbone.files.root.rglob("*.ckpt"))
        recorded = {backbone.files.path(info.sha256) for info in saved}
        assert recorded <= on_disk
        # Older ones stay only while another process might be recording the same content.
        assert all(time.time() - p.stat().st_mtime < GRACE for p in on_disk - recorded), on_disk - recorded
        assert saved[0].state_sha256 == peers[0].history[-1].step.state_sha256

        newcomer = start_peer(backbone.url, project.id, "newcomer", max_epochs=5)
        try:
            await newcomer.finish(timeout=120)
        finally:
            await stop_all(newcomer)
    (synced,) = newcomer.synced()
    assert (synced.source, synced.epoch, synced.state_sha256) == ("checkpoint", 4, saved[0].state_sha256)
    assert newcomer.sync_progress()[-1].received == saved[0].size
    assert [r.step.epoch for r in newcomer.history] == [5]


async def test_a_newcomer_far_faster_than_the_only_proven_member_is_counted_not_refused(tmp_path):
    """A graphics card joining a laptop: on probation its claims count at most the typical
    (the laptop's) pace, so its parts claim many times its cap. That is probation's bound
    speaking, not a lie: they count at the cap, it is proven, and from then on counts in full."""
    project = tiny_project(task_params=MEDIUM, target_batch_size=480)
    async with running_backbone(tmp_path, project) as backbone:
        laptop = start_peer(backbone.url, project.id, "laptop", threads=1, slowdown=12.0)
        card = None
        try:
            await laptop.reached(1, timeout=120)
            card = start_peer(backbone.url, project.id, "card", threads=1)
            await until(lambda: sum(1 for r in card.history if r.my_samples) >= 6, 180,
                        "six steps with the newcomer's samples")
        finally:
            await stop_all(laptop, *([card] if card else []))
        credit = dict(backbone.store.database.execute(
            "SELECT round_id, samples FROM contributions WHERE peer_id=?", (card.peer.peer_id,)).fetchall())
    brought = [r for r in card.history if r.my_samples]
    laptop_samples = {r.step.epoch: r.my_samples for r in laptop.history}
    assert all(r.my_samples > 6 * laptop_samples.get(r.step.epoch, 0) for r in brought[1:]), \
        [(r.my_samples, laptop_samples.get(r.step.epoch)) for r in brought]
    credited = [credit.get(r.step.round_id, 0) for r in brought]
    assert all(credited), f"rounds where the newcomer's work was refused: {credited}"
    assert credited[-1] == brought[-1].my_samples, "still counted at probation's bound once proven"
