"""What an attack did to a running collaboration: its pace in epochs per second while the
attack went on against just before and after, and the checks every hostile test makes of
it (steps, states, the record, credit, crashes, memory)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
from dataclasses import dataclass

from tests.hostile.collaboration import Collaboration


@dataclass
class Window:
    """How fast the collaboration made epochs over a stretch of time, and what each honest
    peer printed meanwhile."""

    first_epoch: int
    last_epoch: int
    seconds: float

    @property
    def rate(self) -> float:
        return (self.last_epoch - self.first_epoch) / self.seconds


async def timed_epochs(collab: Collaboration, epochs: int, timeout: float) -> Window:
    """Wait for the collaboration to make ``epochs`` more epochs and time them from the first
    line of the epoch before to the first line of the last."""
    first = collab.epoch
    await collab.until(lambda: collab.epoch >= first + epochs, timeout, f"{epochs} more epochs")
    last = collab.epoch
    return Window(first, last, collab.arrival(last) - collab.arrival(first))


@dataclass
class Verdict:
    """An attack's effect: the collaboration while it went on, against the same collaboration
    just before and just after it (their mean cancels the drift of a shared machine)."""

    before: Window
    during: Window
    after: Window
    rss_before: dict[str, int]
    rss_after: dict[str, int]

    @property
    def baseline(self) -> float:
        quiet = (self.before, self.after)
        return sum(w.last_epoch - w.first_epoch for w in quiet) / sum(w.seconds for w in quiet)

    @property
    def ratio(self) -> float:
        return self.during.rate / self.baseline

    def figure(self) -> str:
        growth = max(self.rss_after[k] - self.rss_before[k] for k in self.rss_before) / 1e6
        return (f"{self.baseline:.2f} epochs/s without the attack (before {self.before.rate:.2f}, after "
                f"{self.after.rate:.2f}), {self.during.rate:.2f} under it ({self.ratio:.2f}x); "
                f"memory grew at most {growth:.0f} MB")


# Epochs under attack, and as many without it (half before, half after): 5-7 s each of a
# healthy collaboration at 12-16 epochs/s (steps at the target, not past it). Windows of 100
# measured 0.88-1.08x of the baseline in a full run of tests/hostile. An attack that opens
# links at its start weighs the more the shorter its window: the flood's (fifteen
# handshakes) measures over twice this, and a poisoner's own joining cost 0.78-0.86x over
# 60 epochs once steps took the target.
EPOCHS = 80
RATE_FLOOR = 0.8
# Alone with one member, nobody but the honest reducer can judge the poisoner, so nobody
# strikes it: its parts reach that reducer, and are checked there, in every round (with
# the adversary's own sending on the same two cores). CI saw 0.75x once, 1.01-1.06x here.
PAIR_RATE_FLOOR = 0.65
MAX_GROWTH = 150 * 1024 * 1024
LOSS_NOISE = 0.15  # mean loss over a window, as it varies between runs of the same epochs


async def under_attack(collab: Collaboration, attack, epochs: int = EPOCHS, timeout: float = 120,
                       quiet: int | None = None) -> Verdict:
    """Time ``epochs`` epochs while ``attack()`` runs, and ``quiet`` epochs without it just
    before and as many just after (default: half of ``epochs`` each, at most EPOCHS in all)."""
    rss_before = collab.rss()
    quiet = quiet or max(min(epochs, EPOCHS) // 2, 1)
    before = await timed_epochs(collab, quiet, timeout)
    task = asyncio.ensure_future(attack())
    try:
        during = await timed_epochs(collab, epochs, timeout)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    rss_after = collab.rss()
    after = await timed_epochs(collab, quiet, timeout)
    await collab.until(lambda: all(p.epoch >= during.last_epoch for p in collab.peers), 30,
                       "every honest peer to print the window's last epoch")
    return Verdict(before, during, after, rss_before, rss_after)


def assert_unharmed(collab: Collaboration, verdict: Verdict, adversary_ids: list[str],
                    may_earn: bool = False, rate_floor: float = RATE_FLOOR) -> None:
    """What the issue asks of every attack: the collaboration kept its pace, every honest peer
    took every step and holds the same state, the record is the honest peers' own, the
    adversary earned nothing (unless ``may_earn``: its parts passed every check, as a peer's
    that computed would), nobody crashed, and memory stayed bounded."""
    assert verdict.ratio >= rate_floor, verdict.figure()
    recorded = collab.recorded()
    for epoch in range(verdict.during.first_epoch + 1, verdict.during.last_epoch + 1):
        printed = {p.name: e for p in collab.peers for e in p.epochs if e["epoch"] == epoch}
        everyone = {p.name for p in collab.peers}
        assert set(printed) == everyone, f"epoch {epoch}: only {sorted(printed)} took it"
        assert len({e["state_sha256"] for e in printed.values()}) == 1, f"epoch {epoch}: states differ"
        one = next(iter(printed.values()))
        theirs = (one["loss"], one["state_sha256"])
        assert recorded[epoch] == theirs, f"epoch {epoch}: the record is not theirs"
    # Training goes on as it did: the loss keeps to its course (it falls, or holds, within noise).
    losses = {epoch: loss for epoch, (loss, _) in recorded.items()}
    before = [losses[e] for e in range(verdict.before.first_epoch + 1, verdict.before.last_epoch + 1)]
    during = [losses[e] for e in range(verdict.during.first_epoch + 1, verdict.during.last_epoch + 1)]
    assert all(loss is not None and math.isfinite(loss) for loss in before + during)
    assert statistics.mean(during) <= statistics.mean(before) + LOSS_NOISE, (before, during)
    # The curve is the honest peers' own: no loss a poisoner made up (its parts said 0).
    assert min(during) >= 0.5 * min(before), (before, during)
    assert may_earn or collab.credited(adversary_ids) == collab.aggregated(adversary_ids) == 0
    assert all(p.alive for p in collab.processes())
    for name, before in verdict.rss_before.items():
        assert verdict.rss_after[name] - before < MAX_GROWTH, f"{name}: {verdict.figure()}"
