"""The contribution ledger under real collaborations: exact sums, per-user totals, cheaters."""

import time

import pytest

from engine.averaging.robust import OVER_CAP
from tests.collab.accounts import get_json, register
from tests.collab.harness import MEDIUM, running_backbone, start_peer, stop_all, tiny_project
from tests.collab.processes import home_with_login, spawn_peer, terminate
from tests.conftest import until

pytestmark = pytest.mark.slow


def peer_names(store) -> dict[str, str]:
    return dict(store.database.execute("SELECT peer_id, name FROM peers").fetchall())


async def test_credits_add_up_exactly_with_a_peer_killed_mid_run(tmp_path, caplog, database):
    """On SQLite and on PostgreSQL: the ledger's sums are the settled steps'."""
    project = tiny_project(require_account=True, target_batch_size=96, round_timeout=10)
    url = database if isinstance(database, str) else None
    async with running_backbone(tmp_path, project, database=url) as backbone:
        tokens = {user: await register(backbone.url, user) for user in ("alice", "bob")}
        envs = {user: home_with_login(tmp_path / user, backbone.url, user, token)
                for user, token in tokens.items()}
        owners = {"alice-1": "alice", "alice-2": "alice", "bob-1": "bob"}
        began = time.time()
        peers = {name: await spawn_peer(backbone.url, project.id, name, tmp_path, env=envs[user])
                 for name, user in owners.items()}
        tracker = backbone.trackers[project.id]
        try:
            await until(lambda: all(p.epoch >= 3 for p in peers.values()), 120, "three peers at epoch 3")
            all_in = time.time()  # from here on each user has a peer online until the end
            peers["alice-2"].kill()
            killed_at = tracker.epoch
            for name in ("alice-1", "bob-1"):
                await peers[name].reached(killed_at + 3, timeout=90)
        finally:
            await terminate(*peers.values())
        together = time.time() - all_in
        store = backbone.store
        steps = store.rounds.steps(project.id)
        by_user = store.credit.credited_by_user(project.id)
        by_peer = store.credit.credited_by_peer(project.id)
        board = await get_json(f"{backbone.url}/api/projects/{project.id}/leaderboard?limit=10")
        curve = await get_json(f"{backbone.url}/api/projects/{project.id}/curve")
        mine = {user: await get_json(f"{backbone.url}/api/me", token) for user, token in tokens.items()}
        ran = time.time() - began
        names = peer_names(store)

    assert len(steps) >= killed_at + 3
    capped = [r.getMessage() for r in caplog.records if r.name == "engine.backbone.ledger"]
    assert sum(by_user.values()) == sum(s.samples for s in steps) == board["total_samples"], capped
    per_user = {"alice": 0, "bob": 0}
    for peer_id, samples in by_peer.items():
        per_user[owners[names[peer_id]]] += samples
    assert per_user == by_user
    assert by_peer[next(p for p, n in names.items() if n == "alice-2")] > 0
    assert [e["username"] for e in board["entries"]] == sorted(by_user, key=by_user.get, reverse=True)
    assert sum(e["share"] for e in board["entries"]) == pytest.approx(1.0, abs=1e-5)

    # What each user sees of themselves: totals, compute and online time, the hourly timeline.
    for user, me in mine.items():
        (totals,) = me["projects"]
        assert (me["username"], totals["project"], totals["samples"]) == (user, project.id, by_user[user])
        assert totals["rank"] == 1 + sum(v > by_user[user] for v in by_user.values())
        assert 0 < totals["compute_seconds"] < 2 * ran  # at most two peers' worth, for alice
        # Two peers at once count once; a peer is online from its join to the last time it was heard
        # from (heartbeats every 5 s), so a few seconds at the end may be missing.
        assert together - 10 < totals["online_seconds"] < ran + 5
        assert sum(h["samples"] for h in me["timeline"]) == by_user[user]
        assert all(h["hour"] % 3600 == 0 and h["project"] == project.id for h in me["timeline"])
    # The learning curve: one point per recorded step, with the loss the step reported.
    assert [row["epoch"] for row in curve["epochs"]] == [s.epoch for s in steps]
    assert [row["loss"] for row in curve["epochs"]] == pytest.approx([s.loss for s in steps])


@pytest.mark.parametrize("factor", [3, 10])
async def test_a_peer_claiming_more_samples_than_it_computed_is_cut_to_its_cap_or_left_out(tmp_path, factor):
    """Its claim weighs at most its cap for the round (what the backbone saw it compute,
    with room for jitter: up to about twice that, in rounds this short), and is credited at
    most that; a claim of more than four times the cap is a lie: its parts are left out and
    it is credited nothing. Rounds of about a second: in shorter ones the quarter second
    a cap allows for messages in flight is most of the round."""
    project = tiny_project(task_params=MEDIUM, target_batch_size=1440)
    async with running_backbone(tmp_path, project) as backbone:
        tokens = {user: await register(backbone.url, user) for user in ("honest", "cheat")}
        honest = start_peer(backbone.url, project.id, "honest", user_token=tokens["honest"])
        cheat = start_peer(backbone.url, project.id, "cheat", user_token=tokens["cheat"])
        try:
            await until(lambda: cheat.peer.joined, 30, "the cheat to start")
            real_averager = cheat.peer.pipeline.average

            async def lie(plan, vector, samples, loss_sum, timeout):
                return await real_averager(plan, vector * factor, samples * factor, loss_sum * factor,
                                           timeout)

            cheat.peer.pipeline.average = lie
            await honest.reached(8, timeout=90)
        finally:
            await stop_all(honest, cheat)
        credit = {(r, p): n for r, p, n in backbone.store.database.execute(
            "SELECT round_id, peer_id, samples FROM contributions")}
    for r in honest.history:
        assert credit[r.step.round_id, honest.peer.peer_id] == r.my_samples
    lied = [r for r in cheat.history if r.my_samples]
    computed = sum(r.my_samples for r in lied)
    credited = sum(credit.get((r.step.round_id, cheat.peer.peer_id), 0) for r in lied)
    if factor > OVER_CAP:
        assert credited == 0
    else:
        assert len(lied) >= 3
        assert computed < credited < 0.85 * factor * computed
