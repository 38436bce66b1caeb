"""Online time per user in the backbone's real store (SQLite and PostgreSQL): the union of
their peers' sessions."""

import pytest

from engine.backbone.store.repositories import Store


@pytest.fixture
def store(database):
    store = Store(database)
    yield store
    store.close()


def online(store, user) -> float:
    return {t.project: t.online_seconds for t in store.credit.user_totals(user.id)}.get("p", 0.0)


def session(store, user, peer, start, end):
    store.peers.add(peer, "p", peer, "t" * 64, user.id)
    store.peers.connected(peer, at=start)
    return lambda: store.peers.left(peer, at=end)


def test_two_peers_at_once_count_once_in_any_closing_order(store):
    alice = store.accounts.create_user("alice", b"s", b"h")
    long = session(store, alice, "a1", 1000, 1100)
    inner = session(store, alice, "a2", 1010, 1050)
    inner()  # closes first, inside the other
    long()
    assert online(store, alice) == pytest.approx(100)


def test_separate_and_overlapping_sessions_add_up_to_their_union(store):
    bob = store.accounts.create_user("bob", b"s", b"h")
    for peer, start, end in (("b1", 0, 30), ("b2", 20, 50), ("b3", 100, 110), ("b4", 5, 105)):
        session(store, bob, peer, start, end)()
    assert online(store, bob) == pytest.approx(110)  # [0, 110]


def test_each_user_has_their_own_time_and_anonymous_peers_none(store):
    alice, bob = (store.accounts.create_user(name, b"s", b"h") for name in ("alice", "bob"))
    session(store, alice, "a", 0, 60)()
    session(store, bob, "b", 0, 30)()
    store.peers.add("anon", "p", "anon", "t" * 64, None)
    store.peers.connected("anon", at=0)
    store.peers.left("anon", at=500)
    assert (online(store, alice), online(store, bob)) == (pytest.approx(60), pytest.approx(30))
