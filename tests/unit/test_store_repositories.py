"""Every repository of the backbone's store on both engines, SQLite and PostgreSQL: what
the API and the tracker read back is what they wrote, a replay counts once, and a ledger
write that fails midway leaves nothing of itself."""

import time

import pytest

from engine.backbone.ledger import Credit
from engine.backbone.store.account_records import UsernameTaken
from engine.backbone.store.database import Conflict
from engine.backbone.store.repositories import Store
from engine.backbone.tracker.outputs import RoundOpened
from engine.wire.control import CheckpointInfo, Step
from engine.wire.rest import Ranking


@pytest.fixture
def store(database):
    store = Store(database)
    yield store
    store.close()


def step(epoch, round_id, loss=2.0, digest="a"):
    return Step(epoch=epoch, round_id=round_id, loss=loss, samples=64, peers=2, round_seconds=0.5,
                state_sha256=digest * 64)


def test_usernames_are_unique_whatever_their_case_and_log_ins_are_listed_and_revoked(store):
    alice = store.accounts.create_user("Alice", b"salt", b"hash")
    with pytest.raises(UsernameTaken):
        store.accounts.create_user("ALICE", b"s", b"h")
    secret = store.accounts.user_secret("alice")
    assert secret is not None
    assert (secret.user, secret.salt, secret.password_hash) == (alice, b"salt", b"hash")
    store.accounts.add_token(alice, "1" * 64, "cotrain 1.0 on laptop")
    store.accounts.add_token(alice, "2" * 64, "cotrain 1.0 on desktop")
    assert store.accounts.user_for_token("1" * 64) == alice
    listed = store.accounts.tokens(alice.id, "2" * 64)
    assert sorted(s.client for s in listed) == ["cotrain 1.0 on desktop", "cotrain 1.0 on laptop"]
    laptop = next(s for s in listed if s.client.endswith("laptop"))
    assert store.accounts.revoke_token_id(alice.id, laptop.id)
    assert not store.accounts.revoke_token_id(alice.id, laptop.id)  # gone already
    assert store.accounts.user_for_token("1" * 64) is None
    assert [s.current for s in store.accounts.tokens(alice.id, "2" * 64)] == [True]


def test_the_settled_record_survives_a_reopening_and_a_replayed_step_counts_once(store, database):
    store.rounds.round_opened("p", RoundOpened(10, 0, ["x", "y"]))
    store.rounds.round_opened("p", RoundOpened(11, 0, ["x", "y", "z"]))  # the same project's next
    assert store.rounds.unsettled_round("p") == RoundOpened(11, 0, ["x", "y", "z"])
    store.rounds.record_step("p", step(1, 11))
    store.rounds.record_step("p", step(1, 11, loss=9.0))  # replayed after a restart
    assert store.rounds.unsettled_round("p") is None
    store.close()
    again = Store(database)
    try:
        assert again.rounds.collaboration("p") == (1, "a" * 64)
        assert [s.loss for s in again.rounds.steps("p")] == [2.0]
        assert again.rounds.last_round_id() == 11
        assert again.rounds.epoch_state("p", 1) == "a" * 64 and again.rounds.epoch_state("p", 2) is None
    finally:
        again.close()


def test_the_curve_keeps_the_last_step_of_each_epoch_and_its_held_out_score(store):
    store.rounds.record_step("p", step(1, 1, loss=3.0))
    store.rounds.record_step("p", step(2, 2, loss=2.5, digest="b"))
    store.rounds.record_step("p", step(2, 3, loss=2.4, digest="c"))  # epoch 2 again, after a rewind
    store.curve.record_heldout("p", 2, 2.9, 0.5, 1)
    store.curve.record_heldout("p", 2, 2.8, 0.6, 3)  # more peers scored it
    points = store.curve.points("p")
    assert [(p.epoch, p.loss, p.heldout_loss, p.heldout_accuracy) for p in points] == \
        [(1, 3.0, None, None), (2, 2.4, 2.8, 0.6)]


def test_checkpoints_are_listed_newest_first_replaced_rehashed_and_removed(store):
    for epoch in (5, 10):
        store.checkpoints.add("p", CheckpointInfo(epoch, "f" * 64, "s" * 64, 1000 + epoch, ""))
    store.checkpoints.add("p", CheckpointInfo(10, "e" * 64, "s" * 64, 2000, ""))  # written again
    store.checkpoints.update_hash("p", 5, "t" * 64)
    listed = store.checkpoints.listed("p")
    assert [(c.epoch, c.sha256[0], c.state_sha256[0], c.size) for c in listed] == [(10, "e", "s", 2000),
                                                                                  (5, "f", "t", 1005)]
    assert listed[0].url == "/api/projects/p/checkpoints/10"
    store.checkpoints.remove("p", 10)
    assert [c.epoch for c in store.checkpoints.listed("p")] == [5]


def test_the_leaderboard_pages_and_ranks_ties_by_age_and_the_timeline_sums_each_hour(store):
    users = [store.accounts.create_user(f"user{i}", b"s", b"h") for i in range(5)]
    store.rounds.set_collaboration("p", 0, None)
    samples = [50, 80, 80, 10, 0]
    for round_id in (1, 2):
        credits = {f"peer{i}": Credit(n, 1.5, aggregated_bytes=1000 * i) for i, n in enumerate(samples)}
        store.credit.record_credits("p", round_id, credits, {f"peer{i}": u.id for i, u in enumerate(users)})
    store.credit.record_credits("p", 2, {"peer0": Credit(999, 1.0)}, {"peer0": users[0].id})  # a replay
    (totals, page), rows = store.credit.leaderboard("p", 2, 1)
    assert (totals, page) == (440, 20_000)
    assert [(r[0], r[2]) for r in rows] == [("user2", 160), ("user0", 100)]
    assert [store.credit.rank("p", u.id) for u in users] == [3, 1, 2, 4, 5]
    assert store.credit.rank("p", users[0].id, Ranking.AGGREGATED) is None  # aggregated nothing
    assert store.credit.rank("p", users[4].id, Ranking.AGGREGATED) == 1
    hours = store.credit.timeline(users[1].id, time.time() - 7200)
    assert [(h.samples, h.aggregated_bytes, h.hour % 3600) for h in hours] == [(160, 2000, 0)]
    assert isinstance(hours[0].samples, int) and hours[0].compute_seconds == pytest.approx(3.0)


def test_a_rounds_credit_that_fails_midway_writes_nothing(store):
    alice = store.accounts.create_user("alice", b"s", b"h")
    store.rounds.set_collaboration("p", 0, None)
    store.credit.record_credits("p", 1, {"a": Credit(30, 1.0)}, {"a": alice.id})
    with pytest.raises(Conflict):  # its second member names a user who does not exist
        store.credit.record_credits("p", 2, {"a": Credit(30, 1.0), "b": Credit(40, 1.0)},
                                    {"a": alice.id, "b": alice.id + 1000})
    assert store.credit.credited_by_peer("p") == {"a": 30}
    assert store.credit.credited_by_user("p") == {"alice": 30}
    assert store.credit.leaderboard("p", 10, 0)[0] == (30, 0)
    store.credit.record_credits("p", 2, {"a": Credit(30, 1.0)}, {"a": alice.id})  # the round, redone
    assert store.credit.credited_by_user("p") == {"alice": 60}
