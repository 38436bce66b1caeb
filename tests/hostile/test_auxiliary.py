"""Strangers that join as auxiliary peers (reducers that bring no gradient), claim the
fastest links there are, take the parts they are sent and never send a result. Before
trial rounds, every round they were in stalled until its timeout, and new identities
could keep that up without end."""

import asyncio
import contextlib

import pytest

from engine.wire.control import Progress, RoundStart
from engine.wire.types import PeerRole
from tests.hostile.adversary import Adversary, Stranger
from tests.hostile.attack_effect import assert_unharmed, under_attack
from tests.hostile.collaboration import running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
LONG = 500  # epochs per window (~30 s): trials come at most a tenth of the time, measured over many
BOASTED = 1e12  # bytes per second, each way


@pytest.fixture(scope="module")
def collab(tmp_path_factory):
    with running(tmp_path_factory.mktemp("auxiliary")) as collaboration:
        yield collaboration


async def withhold(adversary: Adversary, stranger: Stranger) -> None:
    """Accept every link and part, say nothing back, and boast about the link."""
    adversary.mesh(stranger)  # answers offers: the trainers' links to it open
    while not stranger.closed.is_set():
        epoch = stranger.settled[0] if stranger.settled else 0
        await stranger.send(Progress(epoch, 0, 0.0, upload=BOASTED, download=BOASTED))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stranger.closed.wait(), 0.5)


async def test_auxiliary_peers_that_withhold_results_cost_at_most_their_trials(collab, report_figure):
    async with Adversary(collab.url, collab.project.id) as adversary:
        sybils = [await adversary.join(f"helper-{i}", role=PeerRole.AUXILIARY) for i in range(10)]

        async def attack():
            await asyncio.gather(*(withhold(adversary, s) for s in sybils))

        verdict = await under_attack(collab, attack, epochs=LONG, timeout=300)
        trials = {m.round_id for s in sybils for m in s.received
                  if isinstance(m, RoundStart) and s.peer_id in m.auxiliary}
        report_figure(f"{verdict.figure()}; {len(trials)} trial rounds with a withholding auxiliary peer")
        assert trials, "no withholding auxiliary peer was put in a round: the test proves nothing"
        assert_unharmed(collab, verdict, adversary.peer_ids)
