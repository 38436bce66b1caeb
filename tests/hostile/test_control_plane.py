"""Attacks on the control plane, by a stranger from its own address, against a backbone and
three honest peers started as users start them. Each is timed against the same
collaboration just before and just after it."""

import asyncio
import contextlib
import itertools

import pytest

from engine.wire.control import (
    Progress,
    Ready,
    RoundDone,
    RoundStart,
    Signal,
    SignalData,
    Status,
    SyncRequest,
)
from engine.wire.types import SignalKind
from tests.hostile.adversary import Adversary, Refused, Stranger, member
from tests.hostile.attack_effect import assert_unharmed, under_attack
from tests.hostile.collaboration import running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FORGED = "f" * 64
# Epochs: about thirty seconds at 16 epochs/s (steps at the target), ten times a download's
# longest wait (3 s). The bucket starts full: one whole wait and a twentieth of the time weigh
# 21% of a 19-s window (300 epochs, measured 0.76x), 15% of 31 s.
LONG = 500


@pytest.fixture(scope="module")
def collab(tmp_path_factory):
    with running(tmp_path_factory.mktemp("control-plane")) as collaboration:
        yield collaboration


async def test_a_ready_for_the_next_epoch_moves_nothing(collab, report_figure):
    """Before: one Ready(E+1, any hash) with no round open was adopted, and the honest
    peers resynced to the stranger's state."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        mallory = await adversary.join()

        async def attack():
            for epoch in itertools.count(collab.epoch):
                await mallory.send(Ready(epoch + 1, FORGED))
                await mallory.send(Ready(epoch + 5, FORGED))
                await asyncio.sleep(0.05)  # a steady trickle, well within the rate limits

        verdict = await under_attack(collab, attack)
        report_figure(verdict.figure())
        assert_unharmed(collab, verdict, adversary.peer_ids)
        assert FORGED not in {digest for _, digest in collab.recorded().values()}


async def test_a_forged_round_outcome_writes_neither_state_nor_ledger(collab, report_figure):
    """Before: the first RoundDone of a round decided its hash, loss and credit; a forged one
    with 10^12 samples topped the leaderboard."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        mallory = await adversary.join()
        forged_rounds: list[int] = []

        def forge(msg) -> None:
            if isinstance(msg, RoundStart) and mallory.peer_id in msg.group:
                forged_rounds.append(msg.round_id)
                everyone = {peer: 10**12 for peer in msg.group}
                mallory.later(RoundDone(msg.round_id, msg.epoch, True, FORGED, samples=10**12, loss=0.0,
                                        received=everyone))

        mallory.on_message = forge
        verdict = await under_attack(collab, lambda: member(mallory))
        report_figure(f"{verdict.figure()}; forged {len(forged_rounds)} round outcomes")
        assert forged_rounds, "the stranger was never put in a round"
        assert_unharmed(collab, verdict, adversary.peer_ids)


async def test_asking_for_the_state_without_end_stalls_nobody(collab, report_figure):
    """Before: a SyncRequest repeated without end held the collaboration at 0 epochs for 40 s.
    Now a flood gets its sender thrown out, and identities that ask politely and never
    download hold rounds back a twentieth of the time at most -- measured over windows long
    enough to hold several such waits."""
    async with Adversary(collab.url, collab.project.id) as flooders, \
            Adversary(collab.url, collab.project.id) as askers:
        thrown_out = []

        async def flood():
            while True:
                try:
                    mallory = await flooders.join()
                except Refused as exc:
                    assert exc.status == 429
                    await asyncio.sleep(1.0)  # pacing: it is told when to come back, and tries anyway
                    continue
                while not mallory.closed.is_set():
                    for _ in range(20):
                        await mallory.send(SyncRequest())
                    await asyncio.sleep(0.02)  # pacing: a thousand a second
                thrown_out.append(mallory.ws.close_code)

        async def ask():
            while True:
                with contextlib.suppress(Refused):
                    asker = await askers.join()
                    await asker.send(SyncRequest())
                await asyncio.sleep(1.0)  # pacing: a new identity every second, within the join limit

        async def attack():
            await asyncio.gather(flood(), ask())

        verdict = await under_attack(collab, attack, epochs=LONG)
        report_figure(f"{verdict.figure()}; {len(thrown_out)} flooding identities thrown out, "
                      f"{len(askers.strangers)} identities asked and never downloaded")
        assert thrown_out and all(code == 1008 for code in thrown_out)
        assert_unharmed(collab, verdict, flooders.peer_ids + askers.peer_ids)


async def test_asking_for_the_others_counts_with_every_report_buys_one_answer_per_count(
        collab, report_figure):
    """Before: every report that asked for the others' counts (``Progress.asks_status``, sent
    by an honest peer near the target) got a status, a pass over all members for each: a
    stranger repeating its report at the rate limit made the backbone count everyone a
    hundred times a second. Beside each asker, a control that reports the same without
    asking: it hears the broadcasts and the answer to each of its Readies."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        askers = [await adversary.join(f"asker-{i}", follow=True) for i in range(8)]
        control = await adversary.join("control", follow=True)
        sent: dict[str, int] = {}
        heard: dict[str, int] = {}

        def statuses(stranger) -> int:
            return sum(isinstance(m, Status) for m in stranger.received)

        async def report(stranger, asks: bool) -> None:
            await asyncio.wait_for(stranger.knows_state.wait(), 60)
            await stranger.send(Ready(*stranger.settled))
            before = statuses(stranger)
            try:
                for n in itertools.count(1):
                    if stranger.closed.is_set():
                        return
                    await stranger.send(Progress(stranger.settled[0], 1, 1.0, asks_status=asks))
                    sent[stranger.peer_id] = n
                    await asyncio.sleep(0.01)  # pacing: a hundred a second, within the rate limit
            finally:
                heard[stranger.peer_id] = statuses(stranger) - before

        async def attack():
            await asyncio.gather(report(control, False), *(report(s, True) for s in askers))

        verdict = await under_attack(collab, attack)
        most = max(heard[s.peer_id] for s in askers)
        report_figure(f"{verdict.figure()}; {min(sent.values())}-{max(sent.values())} reports each, "
                      f"askers heard at most {most} statuses, the control {heard[control.peer_id]}")
        assert_unharmed(collab, verdict, adversary.peer_ids)
        # An answer per count: one per epoch each (the control's Readies get as many), where
        # an answer per ask would be the control's share and every report besides.
        assert all(sent[s.peer_id] > 2 * heard[control.peer_id] for s in askers), "too few asks to tell"
        assert most <= 2 * heard[control.peer_id] + 10, (heard, sent)


async def test_silent_identities_cost_the_collaboration_almost_nothing(collab, report_figure):
    """Before: free, silent Sybil identities cut the epoch rate from 2.45/s to 0.05/s. They
    claim huge samples and never send a part: on probation, nobody waits for them."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        sybils = [await adversary.join(f"sybil-{i}") for i in range(20)]

        async def attack():
            await asyncio.gather(*(member(s) for s in sybils))

        verdict = await under_attack(collab, attack)
        in_rounds = sum(1 for s in sybils if s.rounds())
        report_figure(f"{verdict.figure()}; {in_rounds} of {len(sybils)} silent identities "
                      "were put in rounds")
        assert in_rounds, "no silent identity was put in a round: the test proves nothing"
        assert_unharmed(collab, verdict, adversary.peer_ids)


async def test_a_signal_and_offer_flood_at_a_peer_costs_only_its_sender(collab, report_figure):
    """Before: a signal flood made the backbone disconnect its *victim*; an offer flood ran
    the victim out of file descriptors."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        victims = await adversary.scout()
        victim_fds = {p.name: p.fds() for p in collab.peers}
        offer = SignalData(kind=SignalKind.OFFER, conn="x", sdp=await valid_offer())

        async def flood(stranger: Stranger):
            for n in itertools.count():
                for victim in victims:
                    signal = SignalData(kind=SignalKind.OFFER, conn=f"c{n}", sdp=offer.sdp)
                    await stranger.send(Signal(victim, signal))
                if n % 10 == 0:
                    await asyncio.sleep(0.01)
                if stranger.closed.is_set():
                    return

        async def attack():
            identities = []
            for i in range(10):
                with contextlib.suppress(Refused):
                    identities.append(await adversary.join(f"flooder-{i}"))
            await asyncio.gather(*(flood(s) for s in identities))

        verdict = await under_attack(collab, attack)
        fds = {p.name: p.fds() for p in collab.peers}
        report_figure(f"{verdict.figure()}; victims' open files {victim_fds} -> {fds}")
        assert_unharmed(collab, verdict, adversary.peer_ids)
        for name, before in victim_fds.items():
            assert fds[name] < before + 300


async def valid_offer() -> str:
    """A real WebRTC offer, as the flood sends it: each one makes its target set up a connection."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    pc.createDataChannel("x")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp
