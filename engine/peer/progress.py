"""What a peer tells the backbone of its compute between rounds: Progress reports, the
keep-alive of a slow device, and when the collaboration is likely to reach its target
(then reports go at once, so rounds open without lag)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable

from msgspec.structs import replace

from engine.aio import finished_within
from engine.training.accumulator import Accumulated
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import ControlMessage, Progress, Status

SendControl = Callable[[ControlMessage], Awaitable[object]]
# The shortest time between a new peer's reports before its first step (each micro-batch
# otherwise: a tiny model's few milliseconds would exceed the backbone's 150 reports a
# second). Reports that may reach the target have none: each waits for its answer.
MIN_REPORT_GAP = 0.05
AWAY_GRACE = 10.0  # seconds a restarted backbone's peers have to reconnect, before we stop waiting on them


class ProgressReporter:
    def __init__(self, optimizer: CollaborativeOptimizer, send: SendControl, target_batch_size: int,
                 report_interval: float = 0.5) -> None:
        self.optimizer = optimizer
        self.target_batch_size = target_batch_size
        self.report_interval = report_interval
        self.client_mode: Callable[[], bool] = lambda: False
        # (upload, download) bytes per second the peer's link achieves, None while unmeasured
        self.link_estimate: Callable[[], tuple[float | None, float | None]] = lambda: (None, None)
        self._send = send
        self._last_report = 0.0
        self._reported = (-1, 0)  # (the accumulator's generation, its samples) when last told
        self._stepped_once = False
        self._status: Status | None = None
        self._status_time = 0.0
        self._mine_in_status = 0
        self._look_again = asyncio.Event()  # a round took our gradient, or a status came
        self._asked_at: float | None = None  # when a report that may reach the target asked for a status
        self._asked_in = -1  # the last epoch we asked in: from the first ask on, every report asks
        # While the backbone is away, our share of the target by pace when it was lost
        # (None: connected, and its last status counts us).
        self._away_share: float | None = None
        self._away_peers = 0  # members when it was lost
        self._back_since: float | None = None  # the first status since

    async def report(self, force: bool = False) -> None:
        """Tell the backbone how far we are, if a report is due (or ``force``)."""
        opt = self.optimizer
        if opt.synced and not opt.in_round and (force or self.due()):
            await self._report(opt.accumulator.samples, opt.accumulator.loss_sum,
                               opt.accumulator.compute_seconds)

    def due(self) -> bool:
        """Whether to report now: every ``report_interval``, and at once when the collaboration
        is likely to have reached its target, so rounds open without lag. Until our first
        step, at once too: the pace the backbone measures of us includes our first
        micro-batch (allocations, the first shard read: several of the next ones' time), so
        only fresh counts keep a round's cap of us above what we bring. (Also asked on the
        compute thread after each micro-batch: it only reads.)"""
        if self.optimizer.in_round:
            return False  # (overlapped rounds: what accumulates meanwhile is told after the step)
        now = time.monotonic()
        since = now - self._last_report
        first_of_epoch = self._reported_samples == 0 and self.optimizer.accumulator.samples > 0
        return since >= self.report_interval or first_of_epoch or self._target_in_reach(now) or (
            not self._stepped_once and since >= MIN_REPORT_GAP)

    def full(self) -> bool:
        """Whether we hold what the next step needs of us, so that it takes the target to a
        micro-batch per peer: the target less what the others hold (as the backbone counted
        them: never more than they hold, so no wait outlasts a status); while the backbone
        is away, our share of the target by pace; one micro-batch on probation (the first
        round proves us, and our samples do not count before). Alone behind rounds that did
        not settle, a peer once stepped 38 times the target; peers that computed on while
        the backbone was away brought 14,396 samples to a target of 128; a newcomer's first
        round twice the target. Between our step and the round's end (the new state hashed
        beside the next micro-batches) no report is taken: we hold once the target may be
        in reach (digits' peers once computed 6-12 micro-batches each past it there). (Asked
        on the compute thread after each micro-batch too: it only reads.)"""
        opt = self.optimizer
        if opt.in_round:
            return opt.stepped_in_round and self._target_in_reach(time.monotonic())
        return self._awaiting_answer() or opt.accumulator.samples >= min(self.target_batch_size, self._room())

    def _awaiting_answer(self) -> bool:
        """Our last report may have reached the target: compute nothing until the backbone
        answers (the round's start, or a status with the others' counts), for at most a
        report interval. Reports trail compute by a message's way there and back: two
        tiny-model peers each computed five micro-batches more meanwhile (224 for 128)."""
        asked = self._asked_at
        return asked is not None and time.monotonic() - asked < self.report_interval

    def lost_backbone(self) -> None:
        """Until a status counts us and the peers we knew again, the others' counts are
        unknown: hold our share of the target by the paces last heard of, counting
        every member as fast as we are if the status's rate says less (it leaves out
        newcomers on probation). A new backbone knows nobody at first."""
        status, rate = self._status, self.optimizer.throughput.rate()
        peers = status.peers if status is not None else 1
        total = max(status.samples_per_second if status is not None else 0.0, rate * peers, rate)
        self._away_share = self.target_batch_size * rate / total if rate else math.inf
        self._away_peers, self._back_since = peers, None

    async def until_room(self) -> None:
        """Return once another micro-batch may count: while we hold what the step needs of
        us, wait for the round that takes it (our count told the backbone at once; the
        heartbeat keeps telling it we are alive), looking again at each status and each
        ``report_interval`` (a peer may have left; a resync may have emptied the accumulator)."""
        while True:
            self._look_again.clear()  # (before the report: its answer may come during the send)
            if not self.full():
                return
            if self._reported_samples != self.optimizer.accumulator.samples:
                await self.report(force=True)
            await finished_within(self._look_again.wait(), self.report_interval)

    async def report_taken(self, taken: Accumulated) -> None:
        """What we bring to a round, as the backbone's last evidence before it judges our
        claim. Without it, a peer whose only report this epoch came after a slow first
        micro-batch looks slower than it is, and its honest claim gets cut."""
        self._look_again.set()
        self._asked_at = None
        if taken.samples:
            await self._report(taken.samples, taken.loss_sum, taken.compute_seconds)

    def round_ended(self) -> None:
        """Reports go again: a hold since our step looks again at once."""
        self._look_again.set()

    def settled(self, epoch: int) -> None:
        """The backbone's word of ``epoch``: a report of it that asked before it settled got
        no answer (the backbone was still at the epoch before); it is told again now."""
        self.observe_epoch(epoch)
        if epoch == self.optimizer.epoch and self._asked_at is not None:
            self._asked_at, self._reported = None, (-1, 0)
            self._look_again.set()

    def stepped(self) -> None:
        """Our step starts the next epoch for everyone, before the backbone's word of it:
        the others' samples are timed from now, not from the last status (timed from
        there, every micro-batch of the new epoch looked like the one reaching the target,
        and asked the backbone for an answer)."""
        self._stepped_once = True
        self.observe_epoch(self.optimizer.epoch)

    async def keep_alive(self, interval: float) -> None:
        """Report even when no micro-batch finished lately (a slow device, a small CPU
        share): to the backbone, silence means the peer is gone."""
        if time.monotonic() - self._last_report >= interval:
            await self.report(force=True)

    def observe(self, status: Status) -> None:
        """Remember the collaboration's progress, to estimate when the target is reached."""
        now = time.monotonic()
        self._asked_at = None
        if self._away_share is not None and self._back(status, now):
            self._away_share = None
        self._remember(status, now)

    async def tell_if_near(self) -> None:
        """After a status: if the target is in reach and the backbone has not heard our
        count, tell it now, not after the micro-batch under way (140 ms on a shared CPU,
        while the other peer, asking meanwhile, heard our count of the epoch's start and
        computed past the target)."""
        if self.optimizer.accumulator.samples != self._reported_samples and \
                self._target_in_reach(time.monotonic()):
            await self.report(force=True)

    def _remember(self, status: Status, now: float) -> None:
        self._status, self._status_time = status, now
        self._look_again.set()
        self._mine_in_status = self._reported_samples

    def _back(self, status: Status, now: float) -> bool:
        """Whether a status ends the hold by pace: its count is no less than what we
        reported (a restarted backbone's first statuses count nothing), and the peers we
        knew are back (or had ``AWAY_GRACE`` seconds to be). Released on the peers that
        reconnected first, both peers of a test computed the whole target again (224-256
        for 128)."""
        if self._back_since is None:
            self._back_since = now
        counted = status.samples >= self._reported_samples or not status.counts_you
        return counted and (status.peers >= self._away_peers or now - self._back_since >= AWAY_GRACE)

    def observe_epoch(self, epoch: int) -> None:
        """A new epoch starts from zero samples; the peers' rates carry over. (Not a status:
        a step taken while the backbone is away, by the round under way when it went, leaves
        the hold by pace on.)"""
        if self._status is not None and epoch > self._status.epoch:
            self._asked_at = None
            self._remember(replace(self._status, epoch=epoch, samples=0, counts_age=0.0), time.monotonic())
            self._mine_in_status = 0

    @property
    def _reported_samples(self) -> int:
        """What we last told of the gradient accumulating now (0: nothing yet)."""
        generation, samples = self._reported
        return samples if generation == self.optimizer.generation else 0

    async def _report(self, samples: int, loss_sum: float, compute_seconds: float) -> None:
        opt = self.optimizer
        now = self._last_report = time.monotonic()
        self._reported = (opt.generation, opt.accumulator.samples)
        loss = loss_sum / samples if samples else None
        upload, download = self.link_estimate()
        asks = not opt.in_round and self._target_in_reach(now)
        self._asked_at = now if asks else None
        if asks:
            self._asked_in = opt.epoch
        await self._send(Progress(opt.epoch, samples, opt.throughput.rate(), loss, compute_seconds,
                                  self.client_mode(), upload, download, asks_status=asks))

    def _others(self) -> tuple[Status, int] | None:
        """The last status as it bears on our epoch, and the samples the others held in it
        (None: no word of our epoch). Our step may come before the backbone's word of it
        (a Step is sent once the voters answered): the epoch is new to everyone, so the
        others hold nothing yet; taken for no word, a peer computed the whole target then."""
        status, opt = self._status, self.optimizer
        if status is None or status.epoch > opt.epoch:
            return None
        if status.epoch < opt.epoch:
            return replace(status, epoch=opt.epoch, samples=0, counts_age=0.0), 0
        return status, max(status.samples - self._mine_in_status, 0)

    def _room(self) -> float:
        """How many samples of ours the next step needs (inf: no word of the others)."""
        seen = self._others()
        if seen is None:
            return math.inf
        if not seen[0].counts_you:
            return 1
        if self._away_share is not None:
            return self._away_share
        return self.target_batch_size - seen[1]

    def _target_in_reach(self, now: float) -> bool:
        """Whether our next micro-batch may take the collaboration to its target. Once we
        asked in an epoch, every micro-batch may: each then waits for counts at most a
        micro-batch old (the others ask too), so none starts past the target. Estimated
        again after an answer, a fresh count of the others put it out of reach, and digits'
        peers each filled the room their last answer showed, 3-6 micro-batches past it."""
        seen, opt = self._others(), self.optimizer
        if seen is None:
            return False
        if self._asked_in == opt.epoch and not opt.in_round:
            return True
        status, others = seen
        if status.samples_per_second <= 0:
            # No pace known yet (a restarted backbone's first statuses): any micro-batch may
            # be the one that reaches it. Before, peers there reported every half second
            # and each brought the whole target (256 for 128).
            return True
        # The others at the pace the backbone timed of them, or as fast as we compute if
        # that says more; their rates are samples over wall time, and peers held at the
        # target idle (a held peer's rate fell, its partner's estimate with it, and both
        # computed the whole target: 240 for 128).
        # Where all will be after our next micro-batch: asked only once the target is
        # reached, the answer came after each peer's micro-batch more (192 for 128).
        # Too early an estimate costs a message's round trip per micro-batch; too late, a
        # step past the target.
        accumulated = opt.accumulator
        own_pace = (accumulated.samples / accumulated.compute_seconds if accumulated.compute_seconds > 0
                    else opt.throughput.rate())
        others_rate = max(status.pace - own_pace, status.samples_per_second - opt.throughput.rate(),
                          own_pace * (status.peers - 1))
        # The others' counts were reported a while before the status (their age): digits'
        # peers timed them from the status, heard of the other's samples half a second late
        # and each computed 6-12 micro-batches past the target.
        ahead = opt.thread.last_micro_batch_seconds
        estimate = (others + others_rate * (now - self._status_time + status.counts_age + ahead)
                    + accumulated.samples + own_pace * ahead)
        return estimate >= self.target_batch_size
