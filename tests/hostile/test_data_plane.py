"""Attacks on the data plane (WebRTC links between peers), by a stranger from its own address,
against a backbone and three honest peers started as users start them. Each is timed against
the same collaboration just before and just after it."""

import asyncio
import contextlib
import itertools
import re

import pytest

from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mesh import SHUN_FIRST, PeerMesh
from engine.wire.codec import encode
from engine.wire.control import RoundStart
from engine.wire.frames import Part, ReceiveLimit, StateRequest
from tests.conftest import until
from tests.hostile.adversary import Adversary, Stranger, first_chunk, member, next_chunk
from tests.hostile.attack_effect import assert_unharmed, under_attack
from tests.hostile.collaboration import Collaboration, running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def collab(tmp_path_factory):
    with running(tmp_path_factory.mktemp("data-plane")) as collaboration:
        yield collaboration


async def test_malformed_parts_cost_only_their_sender(collab, report_figure):
    """Before: the receiver of a malformed part dropped the sender's *victim* (the sender was
    removed before its part was checked). Now the part is checked first and left out; the
    round goes on with everyone else's."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        mallory = await adversary.join()
        spoiled: list[str] = []
        kinds = itertools.cycle(["short", "wrong index", "wrong epoch", "samples without values"])

        async def spoil(start: RoundStart) -> None:
            reducers = [p for p, share in zip(start.group, start.shares, strict=True) if share > 0]
            for j, victim in enumerate(reducers):
                kind = next(kinds)
                part = Part(round_id=start.round_id, epoch=start.epoch + (kind == "wrong epoch"),
                            index=j + (kind == "wrong index"), samples=10**6, loss_sum=0.0)
                payload = {"short": b"\0" * 7, "samples without values": b""}.get(kind, b"\0" * 4096)
                with contextlib.suppress(LinkClosed, asyncio.TimeoutError):
                    await (await mesh.link(victim, timeout=5)).send(part, payload)
                    spoiled.append(kind)

        def on_message(msg) -> None:
            if isinstance(msg, RoundStart) and mallory.peer_id in msg.group:
                mesh.spawn(spoil(msg))

        mallory.on_message = on_message
        mesh = adversary.mesh(mallory)  # passes every message on to on_message
        verdict = await under_attack(collab, lambda: member(mallory))
        report_figure(f"{verdict.figure()}; {len(spoiled)} malformed parts delivered "
                      f"in {len(mallory.rounds())} rounds")
        assert spoiled, "the stranger never got a part to a reducer"
        assert_unharmed(collab, verdict, adversary.peer_ids)


def rule_breaches() -> dict[str, list[bytes]]:
    """The chunks of each breach of the framing's rules, by name: each one must cost its
    sender its link, whatever the victim had to parse or hold to see it."""
    header = encode(Part(round_id=10**9, epoch=0, index=0, samples=1, loss_sum=0.0))
    return {
        "a header nested 30,000 deep": [first_chunk(1, b"[" * 30_000 + b"]" * 30_000, 0, last=True)],
        "a 1 GiB payload announced": [first_chunk(1, header, 1 << 30, b"\0" * 1000)],
        "forty messages left unfinished": [first_chunk(n, header, 2000, b"\0" * 1000) for n in range(40)],
        "a chunk of no message": [next_chunk(7, b"\0" * 100)],
    }


def assert_the_flood_was_cut_off(collab: Collaboration, flooder: str, victims: list[str],
                                 connected: dict[str, list[float]], cut: dict[str, list[float]]) -> None:
    """What a flood of well-formed frames must come to: ``connected`` and ``cut`` hold, per
    victim, when each link the flooder opened to it opened, and when the flooder saw it cut."""
    # Every victim cut the flood off past its quota, in its own words (the flooder may
    # learn it late: a libwebrtc victim's native threads keep taking the flood in while
    # its event loop works through what came before) ...
    assert set(connected) == set(victims)
    cutting = re.compile(rf"dropping link to {flooder}: (more than \d+ frames a second|more frames "
                         r"than anyone waits for)")
    assert all(cutting.search(p.tail(10**6)) for p in collab.peers), [p.tail() for p in collab.peers]
    # ... and did not let it back in for the first shunning's whole length (a slow
    # machine's window may outlast it: then one more link, cut again).
    for victim, opened in connected.items():
        gaps = [again - before for before, again in zip(cut.get(victim, []), opened[1:], strict=False)]
        assert len(opened) <= len(cut.get(victim, [])) + 1, (victim, opened, cut.get(victim))
        assert all(gap >= SHUN_FIRST - 2 for gap in gaps), (victim, opened, cut[victim])


async def test_broken_unfinished_and_flooded_frames_cost_only_their_sender(collab, report_figure):
    """Before: a peer could keep 32 frames of up to 1 GiB each open per link with no idle
    timeout, a deeply nested header killed its receiver with RecursionError, and one mailbox
    of 256 entries shared by all links let a flood evict honest messages. Now each breach
    drops the breaker's link and its next offers go unanswered; a flood of well-formed frames
    nobody waits for fills only its sender's own quota."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        victims = await adversary.scout()
        breaches = rule_breaches()
        outcomes: dict[str, list[str]] = {}

        async def breach(name: str, chunks: list[bytes]) -> None:
            """One identity per breach: it connects to every victim and sends ``chunks``."""
            stranger = await adversary.join(name[:30])
            mesh = adversary.mesh(stranger)
            outcomes[name] = list(await asyncio.gather(*(breach_one(mesh, v, chunks) for v in victims)))

        flooded: dict[str, int] = {}  # victim -> frames queued for it
        connected: dict[str, list[float]] = {}  # victim -> when each link it let the flooder open opened
        cut: dict[str, list[float]] = {}  # victim -> when the flooder saw each of them cut
        clock = asyncio.get_running_loop().time

        async def flood(mesh: PeerMesh, victim: str) -> None:
            """Well-formed frames for rounds that will never be, as fast as the link takes
            them; when the victim cuts the link, connect again and go on."""
            while True:
                try:
                    link = await mesh.link(victim, timeout=3)
                    connected.setdefault(victim, []).append(clock())
                    for n in itertools.count(flooded.get(victim, 0)):
                        part = Part(round_id=10**6 + n, epoch=0, index=0, samples=1, loss_sum=0.0)
                        await link.send(part, b"\0" * 1024)
                        flooded[victim] = n + 1
                except LinkClosed:
                    if len(cut.get(victim, [])) < len(connected.get(victim, [])):
                        cut.setdefault(victim, []).append(clock())
                    continue

        flooder: list[str] = []

        async def floods() -> None:
            stranger = await adversary.join("flooder")
            flooder.append(stranger.peer_id)
            mesh = adversary.mesh(stranger)
            await asyncio.gather(*(flood(mesh, victim) for victim in victims))

        breaching: list[asyncio.Future] = []

        async def attack() -> None:
            # The breaches run on past the measured window if they must: each waits to see
            # its link cut and its next offer refused, which a loaded machine may take longer
            # to show than the window lasts.
            breaching.append(asyncio.ensure_future(
                asyncio.gather(*(breach(name, chunks) for name, chunks in breaches.items()))))
            await floods()

        # A longer window than the others': the attack opens fifteen links at its start (a
        # second or two of the victims' CPU, once), which over 60 epochs measured 0.76x in CI
        # and over 80 0.71-0.76x on a busy machine, 0.96x on a quiet one; the flood's steady
        # cost is what this asks about.
        verdict = await under_attack(collab, attack, epochs=160, quiet=40)
        await asyncio.wait_for(breaching[0], 90)
        report_figure(f"{verdict.figure()}; each breach, per victim: {outcomes}; "
                      f"flood: frames queued per victim {sorted(flooded.values())}, "
                      f"links opened per victim {sorted(len(opened) for opened in connected.values())}")
        assert_unharmed(collab, verdict, adversary.peer_ids)
        assert set(outcomes) == set(breaches)
        for name, seen in outcomes.items():
            assert seen == ["dropped, then refused"] * len(victims), (name, seen)
        assert_the_flood_was_cut_off(collab, flooder[0], victims, connected, cut)


async def breach_one(mesh: PeerMesh, victim: str, chunks: list[bytes]) -> str:
    """Send ``chunks`` on a new link to ``victim``; then whether it dropped the link, and
    whether it answered an offer after that."""
    link: PeerLink = await mesh.link(victim, timeout=10)
    for chunk in chunks:
        if not link.is_open:
            break
        link.connection.send(chunk)
    try:
        # (Victims drop such a link within a fraction of a second; this process, flooding
        # the same victims on the same event loop, has been seen to learn of it 10 s later.)
        await until(lambda: not link.is_open, 30)
    except AssertionError:
        return "kept"
    try:
        await mesh.link(victim, timeout=3)
    except LinkClosed:
        return "dropped, then refused"
    return "dropped, then answered again"


async def test_asking_for_a_trickle_slows_only_the_asker(collab, report_figure):
    """Before: a peer could ask the others to send it 1,000 B/s, and hold whatever they sent
    it (its round results, a state download) for as long as it liked. Now no link is slowed
    below a floor, a state download that takes too long is cut, and results to a member on
    probation are sent in the background, bounded by the round's time."""
    async with Adversary(collab.url, collab.project.id) as adversary:
        askers = [await adversary.join(f"trickle-{i}") for i in range(2)]
        victims = await adversary.scout()

        async def ask(stranger: Stranger) -> None:
            mesh = adversary.mesh(stranger)
            links = [await mesh.link(victim, timeout=10) for victim in victims]
            for link in links:
                await link.send(ReceiveLimit(bytes_per_second=1.0))
            for n in itertools.count():
                for link in links:
                    with contextlib.suppress(LinkClosed):
                        await link.send(StateRequest(request_id=n))
                await asyncio.sleep(0.5)

        async def attack() -> None:
            await asyncio.gather(*(member(s) for s in askers), *(ask(s) for s in askers))

        verdict = await under_attack(collab, attack)
        report_figure(f"{verdict.figure()}; {sum(len(s.rounds()) for s in askers)} rounds with a "
                      "trickle-asker in them")
        assert_unharmed(collab, verdict, adversary.peer_ids)
