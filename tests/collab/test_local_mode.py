"""Local mode (DiLoCo) with peers as separate processes: elastic like sync mode, with the
same settled state, checks, credit, checkpoints and learning curve after each outer step."""

import pytest

from engine.project import AggregationSpec, LocalSpec
from tests.collab.accounts import get_json
from tests.collab.harness import running_backbone, tiny_project
from tests.collab.processes import spawn_peer, terminate
from tests.conftest import until

pytestmark = pytest.mark.slow


async def test_a_killed_peer_and_a_late_joiner_leave_every_outer_step_agreed(tmp_path, report_figure):
    project = tiny_project(
        mode="local", target_batch_size=192, round_timeout=15, checkpoint_every=2,
        local=LocalSpec(inner_batch_size=16, outer_lr=0.7, outer_momentum=0.9),
        aggregation=AggregationSpec(method="centered_clip", verify_probability=0.5),
    )
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        peers = {f"p{i}": await spawn_peer(backbone.url, project.id, f"p{i}", tmp_path) for i in range(3)}
        try:
            # Each has brought samples to a step: a peer slow to start (CI's load) joins at a later
            # outer step with nothing of its own in the first one it takes, and earns no credit.
            brought = lambda p: p.epoch >= 2 and any(e["my_samples"] for e in p.epochs)  # noqa: E731
            await until(lambda: all(brought(p) for p in peers.values()), 120,
                        "three peers at outer step 2, each with samples in a step")
            during = tracker.round.round_id if tracker.round is not None else None
            peers["p0"].kill()
            await peers["p0"].process.wait()
            killed_at = tracker.epoch
            peers["late"] = await spawn_peer(backbone.url, project.id, "late", tmp_path)
            late = peers["late"]
            await until(lambda: len(late.epochs) >= 3 or late.process.returncode is not None, 120,
                        "three outer steps of the joiner")
            final = late.epoch
            for name in ("p1", "p2"):
                await peers[name].reached(final, timeout=60)
        finally:
            await terminate(*peers.values())
        steps = {s.epoch: s for s in backbone.store.rounds.steps(project.id)}
        checkpoints = backbone.store.checkpoints.listed(project.id)
        credited = backbone.store.credit.credited_by_peer(project.id)
        by_round = dict(backbone.store.database.execute(
            "SELECT round_id, SUM(samples) FROM contributions WHERE project=? GROUP BY round_id",
            (project.id,)))
        db = backbone.store.database
        dead = db.execute("SELECT peer_id FROM peers WHERE name='p0'").fetchone()[0]
        curve = await get_json(f"{backbone.url}/api/projects/{project.id}/curve")

    # One state per outer step, on every peer that took it, and it is the settled one.
    lines = [e for p in peers.values() for e in p.epochs]
    for epoch in {e["epoch"] for e in lines}:
        assert {e["state_sha256"] for e in lines if e["epoch"] == epoch} == {steps[epoch].state_sha256}
    late = peers["late"].epochs
    assert late[0]["epoch"] > killed_at and len(late) >= 3
    assert all(e["peers"] == 3 for e in late[1:]), "the joiner and both survivors in each step"
    assert all(e["samples"] >= project.target_batch_size for e in lines if e["round_id"] != during)
    # Checkpoints hold settled outer steps; credit counts the samples behind the pseudo-gradients.
    assert checkpoints and all(c.state_sha256 == steps[c.epoch].state_sha256 for c in checkpoints)
    # Every round's samples are credited to who brought them, but a dead peer's: in a round
    # it died in, what reducers took from it before it died counts in the step, not to it.
    for step in steps.values():
        if step.round_id == during:
            assert by_round.get(step.round_id, 0) <= step.samples
        else:
            assert by_round.get(step.round_id, 0) == step.samples, step
    assert 0 < credited[dead] <= sum(s.samples for s in steps.values() if s.epoch <= killed_at + 1)
    losses = [p["loss"] for p in curve["epochs"] if p["loss"] is not None]
    assert len(losses) >= final - 1 and min(losses[-3:]) < losses[0]
    report_figure(f"local mode, 3 peers then 2 + a joiner: {final} outer steps, loss {losses[0]:.3f} -> "
                  f"{losses[-1]:.3f}; the joiner's first step {late[0]['epoch']} (killed at {killed_at}); "
                  f"{len(checkpoints)} checkpoints kept, {sum(credited.values())} samples credited")
