"""A peer that becomes ready hears whom its rounds will include, so it links to them before
its first round starts (engine/backbone/tracker/partners.py)."""

from engine.backbone.tracker import Tracker
from engine.wire.control import MAX_PARTNERS, Availability, Partners, Progress, Ready, SyncRequest
from engine.wire.types import PeerRole
from tests.unit.tracker_helpers import Clock, project, sent


def ready(t: Tracker, peer: str) -> list[str] | None:
    """``peer`` joins and becomes ready at epoch 0: the partners it is told, if any."""
    t.join(peer, peer)
    t.handle(peer, SyncRequest())
    told = sent(t.handle(peer, Ready(0, "h0")), Partners)
    assert len(told) <= 1 and all(to == peer for to, _ in told)
    return told[0][1].peers if told else None


def test_a_joiner_is_told_the_members_it_will_average_with_and_nobody_else():
    t = Tracker(project(), clock=Clock())
    assert ready(t, "a") is None  # alone: nobody to link to
    assert ready(t, "b") == ["a"]
    t.join("x", "x", role=PeerRole.AUXILIARY)  # reduces in rounds: linked to as well
    t.handle("x", Progress(0, 0, 0.0, upload=1e6, download=1e6))
    t.join("s", "s")  # still syncing: in no round yet
    t.handle("a", Availability(paused=True))  # its owner needs the machine: in no round
    t.pairs.keep_apart("c", "b")  # their exchange failed: never grouped together for a while
    assert ready(t, "c") == ["x"]
    # Nothing new to say when it says Ready again at the same epoch.
    assert sent(t.handle("c", Ready(0, "h0")), Partners) == []


def test_the_list_is_bounded_and_names_proven_members_first():
    t = Tracker(project(), clock=Clock())
    for i in range(MAX_PARTNERS + 20):
        ready(t, f"p{i:03}")
    t.members.get("p110").proven = True
    told = ready(t, "joiner")
    assert told is not None and len(told) == MAX_PARTNERS
    assert told[0] == "p110" and "joiner" not in told


def test_an_auxiliary_peer_is_told_the_trainers_once_when_first_heard_from():
    t = Tracker(project(), clock=Clock())
    for p in ("a", "b"):
        ready(t, p)
    for aux in ("x", "y"):
        t.join(aux, aux, role=PeerRole.AUXILIARY)
    report = Progress(0, 0, 0.0, upload=1e6, download=1e6)
    assert sent(t.handle("x", report), Partners) == [("x", Partners(peers=["a", "b"]))]
    # It exchanges with trainers only: not with another auxiliary peer.
    assert sent(t.handle("y", report), Partners) == [("y", Partners(peers=["a", "b"]))]
    assert sent(t.handle("x", report), Partners) == []


def test_two_peers_that_reduce_nothing_are_not_linked_and_reducers_come_first():
    clock = Clock()
    t = Tracker(project(), clock=clock)
    ready(t, "a")
    t.handle("a", Progress(0, 0, 0.0, client_mode=True))  # behind a relay: it sends only
    t.join("x", "x", role=PeerRole.AUXILIARY)
    t.handle("x", Progress(0, 0, 0.0, upload=1e6, download=1e6))
    assert ready(t, "b") == ["x", "a"]  # the auxiliary reducer first
    t.join("c", "c")
    t.handle("c", SyncRequest())
    t.members.get("c").sends_only_until = clock.now + 60  # checkers could not get its parts lately
    assert sent(t.handle("c", Ready(0, "h0")), Partners) == [("c", Partners(peers=["x", "b"]))]
