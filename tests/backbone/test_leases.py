"""Several backbone processes on one PostgreSQL database: each project's tracker runs in
the one that holds its lease, and the others pass its peers on to it."""

import threading

import aiohttp
import pytest

from engine.backbone.leases import LEASE_SECONDS
from engine.backbone.server import Backbone, BackboneConfig
from engine.backbone.store.lease_records import LeaseLost
from engine.backbone.store.repositories import Store
from engine.backbone.tracker import RecordStep
from engine.wire.control import Step
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.conftest import until

pytestmark = pytest.mark.slow


def test_a_lease_is_taken_renewed_and_only_taken_over_once_it_expired(database):
    store = Store(database)
    try:
        assert store.leases.take("p", "one", "http://one", LEASE_SECONDS)
        assert not store.leases.take("p", "two", "http://two", LEASE_SECONDS)
        assert store.leases.take("p", "one", "http://one", LEASE_SECONDS, '{"epoch": 3}')  # renewed
        assert store.leases.holder("p").status == '{"epoch": 3}'
        assert store.leases.take("p", "one", "http://one", -1)  # (as if it had not renewed in time)
        assert store.leases.holder("p") is None
        assert store.leases.take("p", "two", "http://two", LEASE_SECONDS)
        assert store.leases.holder("p").holder == "two"
        store.leases.release("p", "one")  # not its to give up any more
        assert store.leases.holder("p").holder == "two"
    finally:
        store.close()


def _step(epoch: int) -> Step:
    return Step(epoch=epoch, round_id=epoch, loss=1.0, samples=64, peers=2, round_seconds=0.1,
                state_sha256=f"{epoch:064x}")


def test_a_holder_whose_lease_ran_out_writes_no_step_after_a_takeover(database):
    """A holder whose event loop stalled past its lease, while another process took the
    project over: its step is refused, and the record stays the new holder's."""
    one, two = Store(database), Store(database)
    try:
        assert one.leases.take("p", "one", "http://one", LEASE_SECONDS)
        with one.fenced("p", "one") as db:
            one.rounds.record_step("p", _step(1), db)
        assert one.leases.take("p", "one", "http://one", -1)  # (it did not renew in time)
        assert two.leases.take("p", "two", "http://two", LEASE_SECONDS)
        with pytest.raises(LeaseLost, match="ran out"), one.fenced("p", "one") as db:
            one.rounds.record_step("p", _step(2), db)
        assert two.rounds.collaboration("p") == (1, _step(1).state_sha256)
        assert [s.epoch for s in two.rounds.steps("p")] == [1]
    finally:
        one.close()
        two.close()


async def test_a_takeover_waits_for_a_fenced_write_under_way(database):
    """A step whose lease check passed is written before another process may take the
    project (it waits for the lease's row), so the new holder starts from that step."""
    one, two = Store(database), Store(database)
    checked, write = threading.Event(), threading.Event()

    def stalled_holder() -> None:
        with one.fenced("p", "one") as db:
            checked.set()
            assert write.wait(30)  # (its loop stalls past the lease)
            one.rounds.record_step("p", _step(1), db)

    try:
        assert one.leases.take("p", "one", "http://one", 0.5)
        holder = threading.Thread(target=stalled_holder)
        holder.start()
        assert checked.wait(30)
        await until(lambda: two.leases.holder("p") is None, 30, "the holder's lease to run out")
        taken: list[bool] = []
        takeover = threading.Thread(target=lambda: taken.append(two.leases.take("p", "two", "http://two", 9)))
        takeover.start()
        takeover.join(0.5)
        assert takeover.is_alive() and not taken, "the takeover waits for the write under way"
        write.set()
        holder.join(30)
        takeover.join(30)
        assert taken == [True]
        assert two.rounds.collaboration("p")[0] == 1
    finally:
        write.set()
        one.close()
        two.close()


async def test_a_backbone_that_lost_its_lease_stops_the_tracker_and_records_nothing(tmp_path, postgres):
    url = postgres.new_database()
    project = tiny_project()
    backbone = Backbone(BackboneConfig(data_dir=tmp_path / "a", database=url), [project])
    await backbone.start()
    other = Store(url)
    try:
        assert project.id in backbone.trackers
        before = other.rounds.collaboration(project.id)
        assert backbone.leases is not None
        other.leases.take(project.id, backbone.leases.holder, backbone.url, -1)  # (its loop stalled)
        assert other.leases.take(project.id, "another process", "http://other", LEASE_SECONDS)
        backbone.execute(project.id, [RecordStep(_step(before[0] + 1))])
        assert project.id not in backbone.trackers
        assert other.rounds.collaboration(project.id) == before
    finally:
        other.close()
        await backbone.stop()


async def test_peers_of_either_process_train_at_the_one_tracker(tmp_path, postgres):
    url = postgres.new_database()
    project = tiny_project()
    proxies = frozenset({"127.0.0.1"})  # (the forwarding process names the peer's address)
    async with running_backbone(tmp_path / "a", project, database=url, trusted_proxies=proxies) as a, \
            running_backbone(tmp_path / "b", project, database=url, trusted_proxies=proxies) as b:
        holder, other = (a, b) if project.id in a.trackers else (b, a)
        assert project.id not in other.trackers
        peers = [start_peer(bb.url, project.id, f"peer-{i}") for i, bb in enumerate((a, b, a))]
        try:
            for p in peers:
                await p.reached(3, timeout=120)
            assert len(holder.sessions) == 3 and not other.sessions  # every socket ends at the tracker
        finally:
            await stop_all(*peers)
        async with aiohttp.ClientSession() as http, \
                http.get(f"{other.url}/api/projects/{project.id}") as resp:
            summary = await resp.json()
    hashes = {e: {r.step.state_sha256 for p in peers for r in p.history if r.step.epoch == e}
              for e in range(1, 4)}
    assert all(len(h) == 1 for h in hashes.values()), hashes
    assert summary["epoch"] >= 3


async def test_the_process_taking_a_project_over_serves_the_checkpoints_the_other_stored(tmp_path, postgres):
    """Checkpoint files live in one folder both processes share, under their content's name."""
    url = postgres.new_database()
    project = tiny_project(checkpoint_every=1, keep_checkpoints=2)
    shared = tmp_path / "shared-checkpoints"
    running = [Backbone(BackboneConfig(data_dir=tmp_path / name, database=url, checkpoints_dir=shared),
                        [project]) for name in "ab"]
    for backbone in running:
        await backbone.start()
    try:
        holder, other = running if project.id in running[0].trackers else running[::-1]
        peers = [start_peer(holder.url, project.id, f"p{i}", max_epochs=3) for i in range(2)]
        try:
            for p in peers:
                assert await p.finish(timeout=120) == "reached epoch 3"
        finally:
            await stop_all(*peers)
        saved = holder.store.checkpoints.listed(project.id)
        assert [info.epoch for info in saved] == [3, 2]
        running.remove(holder)
        await holder.stop()  # (its lease released: the other takes the project at its next renewal)
        await until(lambda: project.id in other.trackers, timeout=LEASE_SECONDS * 2)
        newcomer = start_peer(other.url, project.id, "newcomer", max_epochs=4)
        try:
            await newcomer.finish(timeout=120)
        finally:
            await stop_all(newcomer)
    finally:
        for backbone in running:
            await backbone.stop()
    (synced,) = newcomer.synced()
    assert (synced.source, synced.epoch, synced.state_sha256) == ("checkpoint", 3, saved[0].state_sha256)
    assert newcomer.sync_progress()[-1].received == saved[0].size
    assert [r.step.epoch for r in newcomer.history] == [4]
