"""An auxiliary peer in a real collaboration: a backbone on loopback, two training peers and
one that only aggregates (``cotrain peer --aux``), each with its own account."""

import asyncio

import pytest

from engine.peer.auxiliary import AuxiliaryPeer
from engine.peer.events import Aggregated, PeerEvent
from engine.peer.options import PeerOptions
from engine.project import AggregationSpec
from tests.collab.accounts import get_json, register
from tests.collab.harness import RunningPeer, running_backbone, start_peer, stop_all, tiny_project

pytestmark = pytest.mark.slow


def start_auxiliary(url: str, project: str, name: str, **options) -> RunningPeer:
    events: list[PeerEvent] = []
    peer = AuxiliaryPeer(PeerOptions(backbone_url=url, project_id=project, name=name, auxiliary=True,
                                     **options), events.append)
    return RunningPeer(peer, asyncio.ensure_future(peer.run()), events)


async def test_an_auxiliary_peer_reduces_for_the_trainers_and_is_credited_the_bytes_it_took(tmp_path):
    project = tiny_project(aggregation=AggregationSpec(verify_probability=0.5), compression="fp16")
    async with running_backbone(tmp_path, project) as backbone:
        tokens = {user: await register(backbone.url, user) for user in ("alice", "carol")}
        trainers = [start_peer(backbone.url, project.id, f"t{i}", user_token=tokens["alice"]) for i in (1, 2)]
        helper = start_auxiliary(backbone.url, project.id, "helper", user_token=tokens["carol"])
        try:
            for t in trainers:
                await t.reached(8, timeout=180)
        finally:
            await stop_all(*trainers, helper)
        store = backbone.store
        credited = dict(store.database.execute(
            "SELECT round_id, aggregated_bytes FROM contributions WHERE peer_id=?", (helper.peer.peer_id,)))
        board = await get_json(f"{backbone.url}/api/projects/{project.id}/leaderboard?by=aggregated")
        carol = await get_json(f"{backbone.url}/api/me", tokens["carol"])
        checked = backbone.trackers[project.id].audits.drawn

    rounds = [e for e in helper.events if isinstance(e, Aggregated)]
    assert len(rounds) >= 4, "the auxiliary peer reduced in most rounds"
    # Every epoch the trainers took, they took with the same state.
    histories = [{h.step.epoch: h.step.state_sha256 for h in t.history} for t in trainers]
    common = set(histories[0]) & set(histories[1])
    assert len(common) >= 8 and all(histories[0][e] == histories[1][e] for e in common)
    with_helper = {h.step.round_id for h in trainers[0].history if h.step.peers == 3}
    assert with_helper, "no step had the auxiliary peer in it"
    # Credit: exactly the bytes it took in, in each settled round it reduced in, and it
    # computed nothing.
    bytes_in = {e.round_id: e.bytes_in for e in rounds}
    assert credited and all(credited[r] == bytes_in[r] > 0 for r in credited)
    assert set(credited) <= with_helper
    (entry,) = board["entries"]
    assert (entry["username"], entry["samples"]) == ("carol", 0)
    assert entry["aggregated_bytes"] == sum(credited.values())
    assert board["by"] == "aggregated" and entry["share"] == 1.0
    (totals,) = carol["projects"]
    assert totals["aggregated_bytes"] == sum(credited.values()) and totals["aggregated_rank"] == 1
    assert checked > 0, "no part was drawn for checking: the auxiliary peer's results went unchecked"
