"""Several backbone processes on one PostgreSQL database: each project's tracker runs in
the one that holds its lease, and the others pass its peers on to it."""

import aiohttp
import pytest

from engine.backbone.leases import LEASE_SECONDS
from engine.backbone.store.repositories import Store
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project

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
