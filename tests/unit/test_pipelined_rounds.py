"""Rounds whose shares come in pieces (planning/partition.py), as the tracker opens them:
only when the LP expects the round to move bytes for a while, and with backups and credit
counted per piece."""

from engine.backbone.tracker import RecordCredits
from engine.backbone.tracker.scheduling import PIECES, PIPELINE_FROM
from engine.planning.partition import part_bounds
from engine.planning.sizes import encoded_size
from engine.wire.control import Progress, Reassign
from engine.wire.types import PeerRole
from tests.unit.tracker_helpers import clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture
MBIT = 125_000.0


def settled_with(t, numel: int) -> None:
    """One round of a and b settles; its voters say how long the vector is."""
    start = open_round(t, {"a": 60, "b": 60})
    assert start.pieces == 1  # nothing known of the vector yet
    for p in "ab":
        t.handle(p, done(start, numel=numel))
    assert t.epoch == 1


def test_a_round_that_moves_bytes_for_a_second_or_more_comes_in_pieces(clock):
    t = ready_tracker(clock, peers=("a", "b"))
    for p in "ab":
        t.handle(p, Progress(0, 0, 0.0, upload=10 * MBIT, download=10 * MBIT))
    settled_with(t, 1000)  # 4 kB: a few milliseconds on these links
    clock.now += 2
    small = open_round(t, {"a": 60, "b": 60})
    assert small.pieces == 1
    for p in "ab":
        t.handle(p, done(small, digest="h2", numel=10_000_000))  # 40 MB: seconds
    clock.now += 2
    large = open_round(t, {"a": 60, "b": 60})
    assert t.scheduler.vector_bytes / (10 * MBIT) >= PIPELINE_FROM  # the round moves it at 10 Mbit/s
    assert large.pieces == PIECES
    assert t.round.reducers == ["a"] * PIECES + ["b"] * PIECES
    assert sum(t.round.weights().values()) == 1.0


def test_a_lost_reducers_pieces_all_go_to_the_backup_and_an_auxiliary_peer_is_credited_per_piece(clock):
    t = ready_tracker(clock, peers=("a", "b", "c"), compression="fp16")
    t.join("x", "x", PeerRole.AUXILIARY)
    t.peers["x"].proven = True
    for p in ("a", "b", "c", "x"):
        t.handle(p, Progress(0, 0, 0.0, upload=10 * MBIT, download=10 * MBIT))
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    for p in ("a", "b", "c"):
        t.handle(p, done(start, numel=20_000_000))
    t.handle("x", done(start, digest="", received={p: 40 for p in "abc"}))
    clock.now += 2
    t.handle("x", Progress(1, 0, 0.0, upload=10 * MBIT, download=10 * MBIT))
    start = open_round(t, {"a": 40, "b": 40, "c": 40})
    assert start.pieces == PIECES and start.auxiliary == ["x"]
    ((_, msg),) = sent(t.leave("a"), Reassign)[:1]
    assert len(msg.reducers) == 4 * PIECES and "a" not in msg.reducers
    outs = t.handle("x", done(start, digest="", received={p: 40 for p in "bc"}))
    for p in "bc":
        outs += t.handle(p, done(start, digest="h2", numel=20_000_000, received={p: 40 for p in "bc"}))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    bounds = part_bounds(20_000_000, start.shares, start.pieces)
    held = [encoded_size(hi - lo, "fp16")
            for (lo, hi), reducer in zip(bounds, msg.reducers, strict=True) if reducer == "x"]
    assert record.credits["x"].aggregated_bytes == 2 * sum(held)  # from b and c
