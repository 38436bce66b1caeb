"""Links are set up before the rounds that need them: a peer that becomes ready links to
the members it will average with (engine/backbone/tracker/partners.py, PeerMesh.warm)."""

import pytest

from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.conftest import until

pytestmark = pytest.mark.slow


async def test_peers_link_to_each_other_as_they_become_ready_before_any_round(tmp_path):
    # A target no peer reaches: no round opens, and at epoch 0 everyone builds the seed state
    # alone (no download), so any link between them was set up ahead.
    project = tiny_project(target_batch_size=10**6)
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        peers = [start_peer(backbone.url, project.id, f"p{i}", threads=1) for i in range(3)]

        def meshed() -> bool:
            ids = {p.peer.peer_id for p in peers}
            return "" not in ids and all(p.peer.joined and
                                         set(p.peer.mesh.connected()) == ids - {p.peer.peer_id}
                                         for p in peers)

        try:
            await until(meshed, 60, "every peer linked to the other two")
            assert tracker.round is None and tracker.epoch == 0
            assert not any(p.history for p in peers)
        finally:
            await stop_all(*peers)
