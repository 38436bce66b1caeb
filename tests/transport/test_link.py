"""Real WebRTC connections on loopback, on each stack: framing over data channels, backpressure,
counters."""

import asyncio
import contextlib
import itertools
import os
import socket
import time
from pathlib import Path

import aioice.ice
import aioice.stun
import pytest

from engine.averaging.allreduce import round_key
from engine.transport.backends.aiortc_patches import UDP_RECEIVE_BUFFER
from engine.transport.link import HIGH_WATER, LinkClosed
from engine.transport.mesh import REDIAL_FIRST, SHUN_FIRST
from engine.wire.framing import MAX_CHUNK
from engine.wire.types import SignalKind
from tests.conftest import until
from tests.transport.mesh_pair import blob, make_meshes, transports


async def test_a_large_message_arrives_whole_and_is_counted(stack):
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        assert link.transport is stack
        payload = os.urandom(5 * 1024 * 1024 + 123)
        await link.send(blob(1), payload)
        frame = await meshes["b"].mailbox.get(round_key("part", 1, 0, "a"), timeout=30)
        assert bytes(frame.payload) == payload
        sent, received = meshes["a"].totals(), meshes["b"].totals()
        assert sent.bytes_sent >= len(payload) and received.bytes_received == sent.bytes_sent
        assert sent.messages_sent == received.messages_received >= 1
        assert transports(meshes["b"]) == {"a": stack}
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_link_sockets_have_room_for_a_whole_sctp_window(aiortc_only):
    # A burst that overflows the kernel's UDP buffer loses packets, and each lost tail
    # packet stalls the channel for SCTP's 1 s retransmission timeout.
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        connection = link.connection.pc.sctp.transport.transport._connection  # aioice, under aiortc
        sizes = [p.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                 for p in connection._protocols]
        allowed = int(Path("/proc/sys/net/core/rmem_max").read_text())
        assert sizes and min(sizes) >= min(UDP_RECEIVE_BUFFER, allowed)
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_sending_respects_the_buffer_high_water_mark(stack):
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        peak = 0

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, link.connection.buffered_amount)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(watch())
        await link.send(blob(2), bytes(24 * 1024 * 1024))
        watcher.cancel()
        await meshes["b"].mailbox.get(round_key("part", 2, 0, "a"), timeout=60)
        assert 0 < peak <= HIGH_WATER + MAX_CHUNK
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_simultaneous_connects_settle_on_one_working_link(stack):
    meshes = make_meshes(["a", "b"])
    try:
        ab, ba = await asyncio.gather(meshes["a"].link("b"), meshes["b"].link("a"))
        await ab.send(blob(1), b"from a")
        await ba.send(blob(1), b"from b")
        got_b = await meshes["b"].mailbox.get(round_key("part", 1, 0, "a"), timeout=10)
        got_a = await meshes["a"].mailbox.get(round_key("part", 1, 0, "b"), timeout=10)
        assert (bytes(got_a.payload), bytes(got_b.payload)) == (b"from b", b"from a")
        assert meshes["a"].connected() == ["b"] and meshes["b"].connected() == ["a"]
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_links_asked_for_in_one_turn_of_the_loop_share_one_offer(stack):
    """A round's link beside a warming one (links set up ahead): a second offer to the same
    peer would make it drop the link it is opening, as if ours had died."""
    signals: list = []
    meshes = make_meshes(["a", "b"], signals=signals)
    try:
        meshes["a"].warm(["b"])
        first, second = await asyncio.gather(meshes["a"].link("b"), meshes["a"].link("b"))
        assert first is second and first.is_open
        await until(lambda: meshes["b"].connected() == ["a"], 10, "b's end of the link open")
        assert [kind for sender, _, kind, _ in signals if sender == "a"] == [SignalKind.OFFER]
        assert meshes["a"].connected() == ["b"]
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_a_peer_breaking_the_framing_loses_its_link_and_waiters_learn_at_once(stack):
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        waiter = asyncio.ensure_future(meshes["b"].mailbox.get(round_key("part", 9, 0, "a"), timeout=60))
        link.connection.send(b"this is not a Cotrain frame")
        with pytest.raises(LinkClosed):
            await asyncio.wait_for(waiter, 10)
        assert "a" not in meshes["b"].connected()
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_data_sent_just_before_a_graceful_close_is_delivered(stack):
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        payload = os.urandom(3 * 1024 * 1024)
        await link.send(blob(5), payload)
        await meshes["a"].close()
        frame = await meshes["b"].mailbox.get(round_key("part", 5, 0, "a"), timeout=10)
        assert bytes(frame.payload) == payload
    finally:
        await meshes["b"].close()


async def test_a_link_asked_for_without_dialling_is_the_one_the_other_side_opens(stack):
    """A reducer sends a newcomer's results only over the link the newcomer opens: twenty
    silent strangers on probation must cost it no offers of its own. It waits for the
    newcomer's link (which may open after it asked), and gives up on a silent one."""
    signals: list = []
    meshes = make_meshes(["a", "b"], signals=signals)
    try:
        waiting = asyncio.ensure_future(meshes["a"].link("b", dial=False))
        with pytest.raises(LinkClosed):
            await meshes["a"].link("ghost", timeout=0.5, dial=False)  # (a second, in the meantime)
        assert not waiting.done() and signals == [], "it dialled"
        opened = await meshes["b"].link("a")
        link = await asyncio.wait_for(waiting, 10)
        assert link.is_open and opened.is_open
        assert {(sender, kind) for sender, _, kind, _ in signals} == {("b", SignalKind.OFFER),
                                                                     ("a", SignalKind.ANSWER)}
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_connecting_to_a_peer_that_never_answers_fails_in_bounded_time(stack):
    meshes = make_meshes(["a"], connect_timeout=1.0)
    began = asyncio.get_running_loop().time()
    with pytest.raises(LinkClosed):
        await meshes["a"].link("ghost")
    assert asyncio.get_running_loop().time() - began < 5
    await meshes["a"].close()


async def test_a_peer_that_cannot_be_reached_is_dialled_ever_less_often_until_it_answers(stack):
    """Every round and download asks for links; a peer that never answers is offered to after
    growing pauses, not in a tight loop, and at once again once a link to it opened."""
    signals: list = []
    meshes = make_meshes(["a", "b"], connect_timeout=0.3, signals=signals)
    b = meshes.pop("b")  # b is away: signals to it go nowhere
    try:
        waits = []
        for _ in range(3):
            with pytest.raises(LinkClosed):
                await meshes["a"].link("b", timeout=3)
            waits.append(meshes["a"].redial_in("b"))
        offers = [t for sender, _, kind, t in signals if sender == "a" and kind == SignalKind.OFFER]
        assert len(offers) == 3
        assert REDIAL_FIRST / 2 * 0.9 <= waits[0] <= REDIAL_FIRST
        assert waits[2] > REDIAL_FIRST  # it grew
        gaps = [later - earlier for earlier, later in itertools.pairwise(offers)]
        assert all(gap >= 0.3 + REDIAL_FIRST / 2 * 0.9 for gap in gaps), gaps
        meshes["b"] = b  # back
        await meshes["a"].link("b", timeout=20)
        assert meshes["a"].redial_in("b") == 0
    finally:
        for mesh in (*meshes.values(), b):
            await mesh.close()


async def test_a_peer_whose_frames_break_the_rules_is_cut_off_for_a_while(stack):
    """A garbage chunk costs its sender the link, and its new offers go unanswered, so it
    cannot make us pay one handshake after another; the peer that did nothing wrong keeps
    its link."""
    signals: list = []
    meshes = make_meshes(["a", "b", "c"], connect_timeout=2, signals=signals)
    try:
        to_a = await meshes["b"].link("a")
        await meshes["c"].link("a")
        to_a.connection.send(b"XX" + os.urandom(64))  # not a frame: no magic, no header
        await until(lambda: not to_a.is_open, 10)
        assert meshes["a"].shunned_for("b") > SHUN_FIRST / 2 * 0.9
        with pytest.raises(LinkClosed, match="broke the rules"):
            await meshes["a"].link("b")
        offers = len(signals)
        with pytest.raises(LinkClosed):
            await meshes["b"].link("a", timeout=3)
        assert not [signal for signal in signals[offers:] if signal[0] == "a"]  # a never answered
        assert "c" in meshes["a"].connected()
    finally:
        for mesh in meshes.values():
            await mesh.close()


async def test_a_peer_that_sends_frames_nobody_waits_for_loses_its_link(stack):
    """Frames for rounds that will never be fill the sender's own mailbox quota; past it the
    sender is cut off, and the frames of the peer that did nothing wrong still arrive."""
    meshes = make_meshes(["a", "b", "c"])
    try:
        flooder, honest = await meshes["b"].link("a"), await meshes["c"].link("a")
        with contextlib.suppress(LinkClosed):
            for n in range(meshes["a"].mailbox.max_items * 4):
                await flooder.send(blob(1000 + n), b"x" * 100)
        await until(lambda: not flooder.is_open, 10, "the flooder to lose its link")
        assert meshes["a"].shunned_for("b") > 0
        await honest.send(blob(7), b"honest")
        got = await meshes["a"].mailbox.get(round_key("part", 7, 0, "c"), timeout=10)
        assert bytes(got.payload) == b"honest"
    finally:
        for mesh in meshes.values():
            await mesh.close()


async def test_a_link_survives_a_peer_that_answers_consent_checks_late(monkeypatch, aiortc_only):
    """A peer too busy to answer ICE consent checks within aioice's 0.5 s (averaging at full
    load) keeps its links: late answers renew consent. Checks come every 0.3 s here, each
    answered 0.8 s late; six failures in a row used to drop the link within seconds."""
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.3)
        late = {"answers": 0}
        send_stun = aioice.ice.StunProtocol.send_stun

        def answer_late(protocol, message, addr):
            if message.message_class == aioice.stun.Class.RESPONSE:
                late["answers"] += 1
                asyncio.get_running_loop().call_later(0.8, send_stun, protocol, message, addr)
            else:
                send_stun(protocol, message, addr)

        monkeypatch.setattr(aioice.ice.StunProtocol, "send_stun", answer_late)
        # The consent loops of the link already up wake on the new interval after their
        # current wait (at most ~6 s); then both sides keep answering late.
        await until(lambda: late["answers"] >= 16 or not link.is_open, 40, "sixteen late consent answers")
        assert link.is_open and meshes["b"].connected() == ["a"]
        await link.send(blob(7), b"still here")
        frame = await meshes["b"].mailbox.get(round_key("part", 7, 0, "a"), timeout=10)
        assert bytes(frame.payload) == b"still here"
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_links_idle_since_a_time_and_not_needed_close_and_the_rest_stay(stack):
    """A grouped round closes what earlier plans opened and no round used since: the link
    that carried a frame and the one still needed stay open, on both sides."""
    meshes = make_meshes(["a", "b", "c", "d"])
    try:
        for other in "bcd":
            await meshes["a"].link(other)
        since = time.monotonic()
        await (await meshes["a"].link("b")).send(blob(7), b"used")
        await meshes["b"].mailbox.get(round_key("part", 7, 0, "a"), timeout=10)
        meshes["a"].close_idle({"d"}, since)
        await until(lambda: sorted(meshes["a"].connected()) == ["b", "d"], 10, "the idle link to c closed")
        await until(lambda: meshes["c"].connected() == [], 10, "c to see its link closed")
        assert meshes["b"].connected() == ["a"] and meshes["d"].connected() == ["a"]
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))


async def test_a_link_sending_a_long_message_is_not_idle_however_long_ago_it_began(stack):
    """A state served to a joiner is one message that may take minutes on a home uplink:
    the link counts as in use until it is out, and closing idle links passes it by."""
    meshes = make_meshes(["a", "b"])
    try:
        link = await meshes["a"].link("b")
        payload = os.urandom(64 * 1024 * 1024)
        sending = asyncio.ensure_future(link.send(blob(9), payload))
        began = link.counters.bytes_sent
        await until(lambda: link.counters.bytes_sent > began or sending.done(), 10, "the message under way")
        assert not sending.done() and link.busy
        meshes["a"].close_idle(set(), time.monotonic())
        await sending
        frame = await meshes["b"].mailbox.get(round_key("part", 9, 0, "a"), timeout=60)
        assert bytes(frame.payload) == payload and meshes["a"].connected() == ["b"]
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
