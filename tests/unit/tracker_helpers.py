"""What the tracker's unit tests share: a controllable clock, a small project, a
collaboration ready at epoch 0, and shorthands for reporting and reading its messages."""

import pytest

from engine.backbone.tracker import Send, Tracker
from engine.project import ProjectSpec
from engine.wire.control import CheckpointInfo, Progress, Ready, RoundDone, RoundStart, SyncRequest


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def project(**kw):
    return ProjectSpec(**{"id": "p", "title": "P", "task": "demo-lm", "target_batch_size": 100,
                          "round_timeout": 10, "checkpoint_every": 2, **kw})


def sent(outs, kind):
    return [(o.to, o.msg) for o in outs if isinstance(o, Send) and isinstance(o.msg, kind)]


@pytest.fixture
def clock():
    return Clock()


def open_round(t, samples, computing=1.0):
    """Report ``samples`` per peer (a dict), after ``computing`` seconds of compute (the
    backbone counts no more samples than time allows), and return the RoundStart that opened."""
    t.clock.now += computing
    starts = []
    for peer, n in samples.items():
        starts += sent(t.handle(peer, Progress(t.epoch, n, 10.0)), RoundStart)
    assert starts, "no round opened"
    return starts[0][1]


def ready_tracker(clock, peers=("a", "b"), **kw):
    """A collaboration at epoch 0 whose state "h0" is settled and checkpointed: joiners
    copy it from a peer (with no checkpoint, epoch 0 is the seed everyone builds alone)."""
    t = Tracker(project(**kw), clock=clock, state_sha256="h0",
                checkpoint=CheckpointInfo(0, "s" * 64, "h0", 10, "/c"))
    for p in peers:
        t.join(p, p)
        t.handle(p, SyncRequest())
        t.handle(p, Ready(0, "h0"))
    return t


def done(start, digest="h1", ok=True, **kw):
    """A member's outcome; as a reducer, it got a part from every member (unless told)."""
    kw.setdefault("received", {p: 1 for p in start.group} if ok else {})
    return RoundDone(start.round_id, start.epoch, ok, digest if ok else None, **kw)


def fail_pair(t, start, x, y):
    """``x`` and ``y`` report that they could not exchange; the rest of the group succeeds."""
    t.handle(x, RoundDone(start.round_id, start.epoch, False, error="link", unreachable=[y]))
    t.handle(y, RoundDone(start.round_id, start.epoch, False, error="link", unreachable=[x]))


MBIT = 125_000  # bytes per second
