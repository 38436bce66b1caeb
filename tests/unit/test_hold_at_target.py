"""Where a peer stops accumulating, so that a step takes the target to a micro-batch per
peer: at the target less what the backbone counted of the others; at one micro-batch while
its own samples do not count yet (a newcomer's first round was twice the target); at its
share by pace while the backbone is away (peers brought 14,396 samples to a target of 128
after a restart). Real micro-batches of demo-lm on a real optimizer."""

import asyncio
import time

import pytest
from msgspec.structs import replace

from engine.backbone.rate_limits import Kind, LimitsConfig
from engine.peer import progress as progress_module
from engine.peer.progress import ProgressReporter
from engine.tasks import create_task
from engine.wire.control import Progress, Status
from tests.collab.harness import TINY
from tests.unit.test_micro_batch_runs import counted, synced_optimizer

TARGET, MICRO = 64, TINY["micro_batch"]


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


class Counts:
    """What the backbone counts, as its status tells a peer: the others' samples, and the
    peer's own last report once they count. It answers a report that asks at once, as the
    tracker does."""

    def __init__(self) -> None:
        self.others, self.counts_you, self.rate, self.peers, self.mine = 0, True, 100.0, 2, 0
        self.away = False  # the backbone is gone: nothing answers

    def status(self, epoch: int) -> Status:
        return Status(epoch=epoch, samples=self.others + (self.mine if self.counts_you else 0), target=TARGET,
                      peers=self.peers, samples_per_second=self.rate, counts_you=self.counts_you)


async def peer(task) -> tuple[ProgressReporter, list[Progress], Counts]:
    opt = await synced_optimizer(task)
    sent: list[Progress] = []
    counts = Counts()

    async def send(msg):
        sent.append(msg)
        counts.mine = msg.samples
        if msg.asks_status and not counts.away:
            progress.observe(counts.status(msg.epoch))
    progress = ProgressReporter(opt, send, TARGET, report_interval=30.0)
    return progress, sent, counts


async def accumulate(task, progress: ProgressReporter, limit: int = 200) -> int:
    """Micro-batches until the peer holds what the step needs of it; its samples."""
    opt, ran = progress.optimizer, []
    while not progress.full() and len(ran) < limit:
        await opt.compute_run(counted(task, opt, ran), len(ran),
                              lambda: progress.due() or progress.full() or len(ran) >= limit)
        await progress.report(force=True)
    return opt.accumulator.samples


async def test_alone_a_peer_stops_at_the_target(task):
    progress, _, _ = await peer(task)
    assert await accumulate(task, progress) == TARGET


async def test_a_counted_peer_brings_what_the_others_miss(task):
    progress, sent, counts = await peer(task)
    counts.others = 40
    progress.observe(counts.status(progress.optimizer.epoch))
    held = await accumulate(task, progress)
    assert TARGET - 40 <= held < TARGET - 40 + MICRO
    assert sent[-1].samples == held, "what it holds, the backbone is told"
    assert sent[-1].asks_status, "and asked for the others' counts before going past them"


async def test_counts_reported_a_while_ago_bring_the_ask_forward(task):
    """The others computed since they reported: a peer asks for their counts sooner when
    the status says they are old."""
    asked_at = {}
    for age in (0.0, 30.0):
        progress, sent, counts = await peer(task)
        counts.rate = progress.optimizer.throughput.rate() or 100.0
        progress.observe(replace(counts.status(progress.optimizer.epoch), counts_age=age))
        await accumulate(task, progress, limit=3)
        asked_at[age] = next((m.samples for m in sent if m.asks_status), None)
    assert asked_at[30.0] is not None and (asked_at[0.0] is None or asked_at[30.0] < asked_at[0.0]), asked_at


async def test_a_newcomer_brings_one_micro_batch_until_its_samples_count(task):
    progress, _, counts = await peer(task)
    counts.others, counts.counts_you = 60, False
    progress.observe(counts.status(progress.optimizer.epoch))
    assert await accumulate(task, progress) == MICRO
    # A status that counts it wakes its wait at once (not a report interval of 30 s later).
    waiting = asyncio.ensure_future(progress.until_room())
    await asyncio.sleep(0)
    counts.others, counts.counts_you = 20, True
    progress.observe(counts.status(progress.optimizer.epoch))
    await asyncio.wait_for(waiting, 5)
    assert await accumulate(task, progress) in range(TARGET - 20, TARGET - 20 + MICRO)


async def away(task) -> tuple[ProgressReporter, Counts, int]:
    """A peer that held some samples when the backbone went away, beside another peer
    that computed a hundred times its pace: its share of the target is under a
    micro-batch, and it already holds more. (Paces are timed on a shared machine: a ratio
    of ten moved past a micro-batch under load.)"""
    progress, _, counts = await peer(task)
    epoch = progress.optimizer.epoch
    progress.observe(counts.status(epoch))
    first = await accumulate(task, progress, limit=2)
    counts.rate = 100 * progress.optimizer.throughput.rate()
    progress.observe(counts.status(epoch))
    progress.lost_backbone()
    counts.away = True
    return progress, counts, first


async def test_with_the_backbone_away_a_peer_holds_its_share_by_pace(task):
    progress, counts, first = await away(task)
    epoch = progress.optimizer.epoch
    held = await accumulate(task, progress)
    assert first < TARGET and held == first, (first, held)
    # A restarted backbone's first status counts nobody yet: the hold lasts (before, both
    # peers of tests/collab/test_batch_accounting.py computed the whole target again).
    counts.away = False
    progress.observe(replace(counts.status(epoch), samples=0))
    assert await accumulate(task, progress) == first
    # It counts us, but the other peer is not back yet: its samples would count too.
    progress.observe(replace(counts.status(epoch), peers=1))
    assert await accumulate(task, progress) == first
    progress.observe(counts.status(epoch))  # both back, and nobody else holds anything
    assert await accumulate(task, progress) == TARGET


async def test_a_step_taken_while_the_backbone_is_away_leaves_the_hold_by_pace_on(task):
    """The round under way when the backbone went finishes peer to peer: the step starts a
    new epoch, but it is no word from the backbone that the others are back (taken for
    one, every member computed the whole target while it was away)."""
    progress, _, _ = await away(task)
    opt = progress.optimizer
    epoch = opt.epoch
    taken = await opt.begin_round(epoch, budget=30.0)
    assert taken is not None
    await opt.step(taken.vector / taken.samples, epoch, None)
    opt.end_round()
    progress.stepped()
    assert opt.epoch == epoch + 1
    assert await accumulate(task, progress) == MICRO, "still its share by pace (under a micro-batch)"


async def test_between_its_step_and_the_rounds_end_a_peer_holds_once_the_target_is_in_reach(task):
    """The round ends once the new state is hashed, beside the next epoch's micro-batches,
    and no report is taken before: digits' peers computed 6-12 micro-batches each past
    the target there. Once the round ends, the peer asks, and goes on to what the step
    needs of it."""
    progress, sent, counts = await peer(task)
    opt = progress.optimizer
    epoch = opt.epoch
    counts.rate = 1e9  # the others reach the target at once
    progress.observe(counts.status(epoch))
    await accumulate(task, progress, limit=1)
    taken = await opt.begin_round(epoch, budget=30.0)
    assert taken is not None
    await opt.step(taken.vector / taken.samples, epoch, None)
    progress.stepped()
    assert opt.stepped_in_round
    assert await accumulate(task, progress) == 0, "held: the target may be reached already"
    opt.end_round()
    progress.round_ended()
    counts.others, counts.mine = 40, 0
    assert await accumulate(task, progress) in range(TARGET - 40, TARGET - 40 + MICRO)
    assert sent[-1].asks_status and sent[-1].epoch == epoch + 1


async def test_a_peer_that_never_comes_back_holds_nobody_up(task, monkeypatch):
    """The hold by pace waits for the peers it knew only so long: a peer that left while
    the backbone was away would otherwise keep the others at their shares, short of the
    target, for good."""
    monkeypatch.setattr(progress_module, "AWAY_GRACE", 0.0)
    progress, counts, _ = await away(task)
    counts.peers, counts.away = 1, False
    progress.observe(counts.status(progress.optimizer.epoch))  # counts us; the other is gone
    assert await accumulate(task, progress) == TARGET


async def test_a_new_peer_reports_its_count_often_but_within_the_backbones_budget(task):
    """Before its first step a peer's pace is unknown, so it reports often -- not after
    every micro-batch: a tiny model's can take a millisecond, past the reports the backbone
    takes from a peer (it drops the rest, and disconnects a peer that keeps on)."""
    opt = await synced_optimizer(task)
    sent: list[Progress] = []

    async def send(msg):
        sent.append(msg)
    progress = ProgressReporter(opt, send, 10**6, report_interval=30.0)
    ran: list[int] = []

    def instant(index: int) -> tuple[int, float]:  # (the fastest model there could be)
        ran.append(index)
        return MICRO, 1.0
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        await opt.compute_run(instant, len(ran), progress.due)
        await progress.report()
    seconds = time.monotonic() - began
    budget = LimitsConfig().per_peer[Kind.REPORT].per_second
    assert len(ran) > budget * seconds, "micro-batches faster than the backbone takes reports"
    assert 0.25 * seconds / progress_module.MIN_REPORT_GAP <= len(sent) < budget * seconds / 2, len(sent)


async def test_after_its_first_ask_of_an_epoch_every_report_asks(task):
    """Each micro-batch then waits for counts at most one micro-batch old: estimated again
    after an answer, a fresh count put the target out of reach, and digits' peers each
    filled the room their last answer showed, 3-6 micro-batches past the target."""
    progress, sent, counts = await peer(task)
    counts.rate = 1e9  # the others look near the target: the first report asks
    progress.observe(counts.status(progress.optimizer.epoch))
    counts.rate = 1.0  # every answer says they are far from it
    assert await accumulate(task, progress) == TARGET
    assert len(sent) > 2 and all(m.asks_status for m in sent), [m.asks_status for m in sent]


@pytest.mark.parametrize("others", [TARGET - MICRO, 0])
async def test_a_status_near_the_target_has_an_untold_count_told_at_once(task, others):
    """Not after the micro-batch under way: on a shared CPU that took 140 ms, while the
    other peer, asking meanwhile, heard our count of the epoch's start."""
    progress, sent, counts = await peer(task)
    opt = progress.optimizer
    await accumulate(task, progress, limit=1)
    told = len(sent)
    await opt.compute_run(counted(task, opt, []), 1, lambda: True)  # one micro-batch, untold
    counts.others, counts.rate = others, 1.0
    progress.observe(counts.status(opt.epoch))
    await progress.tell_if_near()
    if others:
        assert len(sent) == told + 1 and sent[-1].samples == opt.accumulator.samples and sent[-1].asks_status
    else:
        assert len(sent) == told, "far from the target, it waits for its next report"
