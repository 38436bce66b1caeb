"""Claims a stranger makes about its work, against a backbone and three honest peers started
as users start them (the stranger computes nothing: tests/hostile/poisoner.py). Before:
a part claiming 10^12 samples with values scaled to match passed every check and won 469 of
536 steps; one at the wire's maximum (10^15) made the honest reducers' results invalid, and
their receivers cut the *honest* reducers off; a Ready followed at once by a Progress gave a
zero-compute poisoner a pace of a million samples a second and 720,049 samples of credit."""

import asyncio
import contextlib

import aiohttp
import pytest

from engine.wire.control import Progress, Ready
from engine.wire.rest import ProjectList, reply_codec
from tests.hostile.adversary import Adversary, Stranger, member
from tests.hostile.attack_effect import assert_unharmed, under_attack
from tests.hostile.collaboration import running
from tests.hostile.poisoner import poisoned, scaled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def collab(tmp_path_factory):
    with running(tmp_path_factory.mktemp("claims")) as collaboration:
        yield collaboration


async def test_a_claim_of_a_trillion_samples_with_values_to_match_is_left_out(collab, report_figure):
    sent, refused = await poisoned(collab, scaled(10**12), report_figure, "10^12 samples, values scaled")
    assert refused >= 1 and refused * 2 >= sent, (sent, refused)


async def test_a_claim_at_the_wire_maximum_cuts_no_honest_reducer_off(collab, report_figure):
    await poisoned(collab, scaled(10**15), report_figure, "10^15 samples, values scaled")
    for peer in collab.peers:
        text = peer.log.read_text(errors="replace")
        assert "is not for this epoch" not in text and "ignoring a bad message" not in text, peer.name


async def forge_pace(stranger: Stranger) -> None:
    """Ready, then at once a Progress of a million samples, over and over: before, each
    Ready restarted the tally the pace was timed from."""
    stranger.follow = True
    await asyncio.wait_for(stranger.knows_state.wait(), 60)
    while not stranger.closed.is_set():
        assert stranger.settled is not None
        await stranger.send(Ready(*stranger.settled))
        await stranger.send(Progress(stranger.settled[0], 10**6, 1e6, compute_seconds=0.0))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stranger.closed.wait(), 0.1)


async def test_ready_then_progress_forges_no_pace_and_earns_nothing(collab, report_figure):
    _, refused = await poisoned(collab, scaled(10**6), report_figure, "Ready then Progress, 10^6 claimed",
                                stay=forge_pace)
    assert refused >= 1


async def test_sybils_at_the_wire_maximum_leave_the_project_list_readable(collab, report_figure):
    """Before: two identities reporting 10^15 samples each made GET /api/projects return a
    total the app's own codec refused (the Projects page broke for everyone), and half the
    status messages to honest peers undecodable."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        sybils = [await adversary.join(f"sybil-{i}") for i in range(3)]
        read: list[ProjectList] = []

        async def attack():
            watching = [asyncio.ensure_future(member(s, samples=10**15)) for s in sybils]
            try:
                async with aiohttp.ClientSession() as http:
                    while True:
                        async with http.get(f"{collab.url}/api/projects") as resp:
                            read.append(reply_codec(ProjectList).decode(await resp.read()))
                        await asyncio.sleep(0.2)
            finally:
                for task in watching:
                    task.cancel()

        verdict = await under_attack(collab, attack)
        report_figure(f"{verdict.figure()}; the project list read {len(read)} times")
        assert read and all(p.samples <= 10**15 for listing in read for p in listing.projects)
        assert_unharmed(collab, verdict, adversary.peer_ids)
    for peer in collab.peers:
        assert "ignoring a bad message" not in peer.log.read_text(errors="replace"), peer.name
