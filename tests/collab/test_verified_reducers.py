"""Checked reducers in a real collaboration (in-process peers on loopback): honest parts
check out and their rounds settle; a reducer whose result does not follow from its inputs
is caught the first time its part is drawn, expelled, and no honest peer keeps that step."""

import pytest

from engine.averaging import tensor_parts
from engine.backbone.tracker import scheduling
from engine.project import AggregationSpec
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.conftest import until

pytestmark = pytest.mark.slow


def checked_project(probability: float):
    return tiny_project(target_batch_size=96, round_timeout=10,
                        aggregation=AggregationSpec(verify_probability=probability))


@pytest.mark.parametrize("pieces", [False, True], ids=["whole-parts", "in-pieces"])
async def test_honest_reducers_pass_every_check_and_the_peers_agree(tmp_path, monkeypatch, pieces):
    if pieces:  # every round pipelined: each reducer holds several parts, each checked
        monkeypatch.setattr(scheduling, "PIPELINE_FROM", 0.0)
    project = checked_project(1.0)
    async with running_backbone(tmp_path, project) as backbone:
        peers = [start_peer(backbone.url, project.id, f"p{i}") for i in range(3)]
        try:
            for p in peers:
                await p.reached(6, timeout=120)
        finally:
            await stop_all(*peers)
        auditor = backbone.trackers[project.id].audits
    assert auditor.drawn >= 6 * 2 * (scheduling.PIECES if pieces else 1)  # every part of every round
    assert auditor.caught == 0
    for epoch in range(1, 7):
        hashes = {r.step.state_sha256 for p in peers for r in p.history if r.step.epoch == epoch}
        assert len(hashes) == 1, f"epoch {epoch}: {hashes}"


async def test_a_wrong_reducer_is_caught_expelled_and_its_step_undone(tmp_path, monkeypatch):
    project = checked_project(1.0)
    liar_id = ""
    lied: list[int] = []  # rounds whose result the liar changed
    combine = tensor_parts.TensorPartReducer.combine

    def wrong(self, contributions):
        combined, inputs = combine(self, contributions)
        if self.plan.me == liar_id:
            combined.values.mul_(-3.0)  # everyone applies it, and it commits to it: hashes agree
            lied.append(self.plan.round_id)
        return combined, inputs

    monkeypatch.setattr(tensor_parts.TensorPartReducer, "combine", wrong)
    async with running_backbone(tmp_path, project) as backbone:
        honest = [start_peer(backbone.url, project.id, f"honest-{i}") for i in range(3)]
        try:
            for p in honest:
                await p.reached(2, timeout=120)
            liar = start_peer(backbone.url, project.id, "liar")
            await until(lambda: liar.peer.peer_id, 30, "the liar to join")
            liar_id = liar.peer.peer_id
            tracker = backbone.trackers[project.id]
            await until(lambda: tracker.audits.caught, 120, "the wrong reducer to be caught")
            caught_at = tracker.epoch
            for p in honest:
                await p.reached(caught_at + 3, timeout=120)
            assert tracker.members.get(liar_id).excluded_until > 0
        finally:
            await stop_all(*honest, liar)
    assert lied, "the liar never reduced a part: the test proves nothing"
    kept_rounds = {r.step.round_id for p in honest for r in p.history}
    assert not kept_rounds & set(lied), "an honest peer kept a step with the wrong result"
    for epoch in range(1, caught_at + 4):
        hashes = {r.step.state_sha256 for p in honest for r in p.history if r.step.epoch == epoch}
        assert len(hashes) <= 1, f"epoch {epoch}: {hashes}"
