"""Several backbone processes on one PostgreSQL database: each project's tracker runs in
the one that holds its lease, and the others pass its peers on to it."""

import aiohttp
import pytest

from engine.backbone.leases import LEASE_SECONDS
from engine.backbone.server import Backbone, BackboneConfig
from engine.backbone.store.repositories import Store
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
