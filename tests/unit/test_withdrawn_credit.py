"""Credit withdrawn from a reducer caught lying, in the backbone's real store (SQLite and PostgreSQL): it
leaves the user's total and the project's, shows on the leaderboard as withdrawn, and a
withdrawal replayed changes nothing."""

import time

import pytest

from engine.backbone.ledger import Credit
from engine.backbone.store.repositories import Store
from engine.wire.control import Step


@pytest.fixture
def store(database):
    store = Store(database)
    yield store
    store.close()


def settled(store, round_id, credits, owners):
    store.rounds.record_step("p", Step(epoch=round_id, round_id=round_id, loss=1.0, samples=sum(
        c.samples for c in credits.values()), peers=len(credits), round_seconds=0.1, state_sha256="h" * 64))
    store.credit.record_credits("p", round_id, credits, owners)


def test_withdrawn_credit_leaves_the_totals_and_shows_on_the_leaderboard(store):
    alice, mallory = (store.accounts.create_user(name, b"s", b"h") for name in ("alice", "mallory"))
    owners = {"a": alice.id, "m": mallory.id}
    for round_id in (1, 2, 3):
        settled(store, round_id, {"a": Credit(30, 1.0), "m": Credit(40, 1.0)}, owners)
    assert store.credit.credited_by_user("p") == {"alice": 90, "mallory": 120}

    assert store.credit.withdraw_credits("p", "m", [2, 3, 99], "it was caught: a wrong result") == 80
    assert store.credit.withdraw_credits("p", "m", [2, 3], "again") == 0  # a replay takes nothing more
    assert store.credit.credited_by_user("p") == {"alice": 90, "mallory": 40}
    assert store.credit.credited_by_peer("p") == {"a": 90, "m": 40}
    (totals, _), rows = store.credit.leaderboard("p", 10, 0)
    assert totals == 130
    by_name = {row[0]: row for row in rows}
    assert by_name["mallory"][2] == 40 and by_name["mallory"][6] == 80 and by_name["alice"][6] == 0
    (mine,) = store.credit.user_totals(mallory.id)
    assert (mine.samples, mine.withdrawn, mine.compute_seconds) == (40, 80, pytest.approx(1.0))
    assert sum(h.samples for h in store.credit.timeline(mallory.id, time.time() - 3600)) == 40
