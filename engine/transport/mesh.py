"""The links of one peer, set up on demand through the backbone's signaling relay.

Either side may need a link first (a round, a state download), so either side may offer.
Each offer and answer names the stack it was made with (engine/transport/backends/): a pair
runs native when both ends have it.
When two offers cross ("glare"), the offer of the peer with the smaller id wins and the
other side answers it instead of waiting for its own.

Offers cost sockets, so they are bounded: one answer under way per peer, and at most
``max_connections`` connections in all -- at the limit, a new offer takes the place of
the link idle longest, or is refused if every link is busy. An offer to a peer that could
not be reached waits first, longer after each failure (0.5 s doubling to 8 s, jittered), so a
peer behind a broken NAT is not dialled in a tight loop by every round and download. A peer
whose frames broke the rules (or that sent more than anyone waits for) is neither answered nor
dialled for a while (30 s, doubling with each offence up to an hour): each new connection costs
us a handshake.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine.transport import backends
from engine.transport.connection import StackConnection
from engine.transport.counters import LinkCounters
from engine.transport.ice import IceSettings
from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mailbox import Mailbox
from engine.transport.pauses import Pauses
from engine.transport.shaping import RateLimiter
from engine.wire.control import SignalData
from engine.wire.framing import Frame, Incoming
from engine.wire.types import SignalKind, Transport

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 200
IDLE_LINK = 60.0  # a link with no frame either way for this long may make room for another
REDIAL_FIRST, REDIAL_CAP = 0.5, 8.0  # seconds before offering again to a peer that failed
SHUN_FIRST, SHUN_CAP = 30.0, 3600.0  # seconds without links to a peer that broke the rules

SendSignal = Callable[[str, SignalData], Awaitable[None]]


@dataclass
class _Offer:
    conn: str
    connection: StackConnection
    answer: asyncio.Future[SignalData]


class PeerMesh:
    """This peer's links to the others, opened on demand through the backbone's signaling,
    a few ahead of the rounds that need them, closed when idle or when a peer breaks the
    rules. Frames that arrive go to ``on_frame``; the round code only asks for a link."""

    def __init__(
        self,
        me: str,
        send_signal: SendSignal,
        config: IceSettings,
        mailbox: Mailbox,
        on_frame: Callable[[str, Frame], None],
        on_incoming: Callable[[str, Incoming], None] | None = None,
        max_payload: int = 1 << 30,
        connect_timeout: float = 30.0,
        upload: RateLimiter | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.me = me
        self.config = config
        self.mailbox = mailbox
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self._send_signal = send_signal
        self._on_frame = on_frame
        self._on_incoming = on_incoming
        self._max_payload = max_payload
        self._links: dict[str, PeerLink] = {}
        self._offers: dict[str, _Offer] = {}
        self._answering: set[str] = set()  # peers whose offer we are answering right now
        self._arrivals: dict[str, asyncio.Future[PeerLink]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._retired = LinkCounters()
        self._redial = Pauses(REDIAL_FIRST, REDIAL_CAP)  # peers that could not be reached lately
        self._shunned = Pauses(SHUN_FIRST, SHUN_CAP)  # peers whose frames broke the rules
        self._closing = False
        self._transports: dict[str, list[Transport]] = {}  # what each peer said it can run
        self.upload = upload or RateLimiter()
        self.download_cap: float | None = None
        mailbox.on_overflow = self._overflowed
        self.transports = backends.available()  # the stacks this peer offers, the preferred first

    async def link(self, peer_id: str, timeout: float | None = None, dial: bool = True) -> PeerLink:
        """The open link to ``peer_id``, connecting first if there is none. Without ``dial``,
        only a link it opens to us will do (a newcomer's may still be on its way): a
        stranger who never speaks costs us no connection of our own."""
        link = self._links.get(peer_id)
        if link is not None and link.is_open:
            return link
        shunned = self._shunned.left(peer_id)
        if shunned:
            raise LinkClosed(f"{peer_id} broke the rules: no links to it for {shunned:.0f} s", peer_id)
        arrival = self._arrival(peer_id)
        if dial and peer_id not in self._offers and peer_id not in self._answering:
            # An answer under way brings the link too; a second offer now would make the
            # other side drop the link it is about to open, as if ours had died. (So the
            # offer is registered here, not when its task starts: a second ``link`` in the
            # same turn of the loop -- a round's beside a warming one -- must see it.)
            self.spawn(self._offer(peer_id, self._new_offer(peer_id)))
        try:
            return await asyncio.wait_for(asyncio.shield(arrival), timeout or self.connect_timeout)
        except asyncio.TimeoutError:
            raise LinkClosed(f"could not connect to {peer_id} in time", peer_id) from None

    def warm(self, peer_ids: list[str]) -> None:
        """Link to ``peer_ids`` in the background, before a round needs them (one that
        failed lately is dialled after its pause, as for a round; one that fails now, again
        when a round needs it). At most half the connections are filled this way, so
        warming never closes a link in use."""
        room = self.max_connections // 2 - len(self._links) - len(self._offers) - len(self._answering)
        wanted = [p for p in peer_ids if p != self.me and p not in self._links and p not in self._offers
                  and p not in self._answering and not self._shunned.left(p)]
        for peer_id in wanted[:max(room, 0)]:
            self.spawn(_link_ahead(self, peer_id))

    def close_idle(self, needed: set[str], since: float) -> None:
        """Close, in the background, the links that carried nothing since ``since``
        (monotonic) and carry nothing now, to peers not in ``needed``: a grouped round needs
        a few links, and those of plans past would pile up."""
        for link in [link for p, link in self._links.items()
                     if p not in needed and link.last_active < since and not link.busy]:
            log.debug("closing the idle link to %s", link.peer_id)
            self.spawn(link.close())

    def connected(self) -> list[str]:
        return [p for p, link in self._links.items() if link.is_open]

    def open_links(self) -> dict[str, PeerLink]:
        """The open links by peer: their paths, stacks and relays feed reports and tests."""
        return {p: link for p, link in self._links.items() if link.is_open}

    def totals(self) -> LinkCounters:
        total = self._retired
        for link in self._links.values():
            total = total + link.counters
        return total

    def set_download_cap(self, bytes_per_second: float | None) -> None:
        """Share ``bytes_per_second`` among the open links; each peer is asked to keep to it."""
        self.download_cap = bytes_per_second
        self.spawn(self._advertise_limits())

    async def _advertise_limits(self) -> None:
        links = [link for link in self._links.values() if link.is_open]
        share = self.download_cap / len(links) if self.download_cap and links else None
        await asyncio.gather(*(link.ask_limit(share) for link in links))

    async def handle_signal(self, sender: str, signal: SignalData) -> None:
        """Act on an offer or answer relayed by the backbone; signals the stack cannot use are
        logged and dropped."""
        try:
            if signal.kind is SignalKind.OFFER:
                await self._answer(sender, signal)
            else:
                offer = self._offers.get(sender)
                if offer is not None and offer.conn == signal.conn and not offer.answer.done():
                    offer.answer.set_result(signal)
        except Exception as exc:  # the stacks reject a malformed SDP with assorted errors
            log.warning("could not use signal from %s: %s", sender, exc)

    async def drop(self, peer_id: str) -> None:
        link = self._links.get(peer_id)
        if link is not None:
            await link.close()

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for offer in list(self._offers.values()):
            await offer.connection.close()
        await asyncio.gather(*(link.close_gracefully() for link in list(self._links.values())))

    def _arrival(self, peer_id: str) -> asyncio.Future[PeerLink]:
        arrival = self._arrivals.get(peer_id)
        if arrival is None or arrival.done():
            arrival = asyncio.get_running_loop().create_future()
            arrival.add_done_callback(_retrieve)
            self._arrivals[peer_id] = arrival
        return arrival

    def spawn(self, coro: Awaitable) -> asyncio.Future:
        """Run ``coro`` for as long as the mesh lives (cancelled when it closes)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _new_connection(self, peer_id: str, transport: Transport) -> tuple[StackConnection, PeerLink]:
        """A connection whose link listens from the start: the other side may send the
        moment its end of the channel opens, before ours reports open."""
        connection = backends.connect(transport, self.config)
        if connection.transport is not transport:  # the native stack failed to start: say so from now on
            self.transports = [t for t in self.transports if t is not transport] or [connection.transport]
        link = PeerLink(peer_id, connection, self._on_frame, self._link_closed, self._on_incoming,
                        self._max_payload, self.upload)
        return connection, link

    def redial_in(self, peer_id: str) -> float:
        """Seconds before a new offer to ``peer_id`` goes out (0 unless it failed lately)."""
        return self._redial.left(peer_id)

    def shunned_for(self, peer_id: str) -> float:
        """Seconds before ``peer_id``, whose frames broke the rules, may connect again."""
        return self._shunned.left(peer_id)

    def _new_offer(self, peer_id: str) -> tuple[_Offer, PeerLink]:
        transport = backends.for_offer(self.transports, self._transports.get(peer_id))
        connection, link = self._new_connection(peer_id, transport)
        offer = _Offer(uuid.uuid4().hex, connection, asyncio.get_running_loop().create_future())
        self._offers[peer_id] = offer
        return offer, link

    async def _offer(self, peer_id: str, new: tuple[_Offer, PeerLink]) -> None:
        offer, link = new
        connection = offer.connection
        try:
            wait = self.redial_in(peer_id)
            if wait:
                await asyncio.sleep(wait)  # a pause between attempts, not a synchronisation
            sdp = await asyncio.wait_for(connection.offer(), self.connect_timeout)
            signal = _signal(SignalKind.OFFER, offer.conn, sdp, connection, self.transports)
            await self._send_signal(peer_id, signal)
            answer = await asyncio.wait_for(offer.answer, self.connect_timeout)
            _remember(self._transports, peer_id, answer.transports, 4 * self.max_connections)
            await connection.accept(answer.sdp)
            await asyncio.wait_for(connection.opened(), self.connect_timeout)
            self._adopt(link)
        except asyncio.CancelledError:
            await connection.close()
            raise
        except Exception as exc:
            await connection.close()
            self._redial.extend(peer_id)
            log.info("connecting to %s failed: %s", peer_id, exc)
            arrival = self._arrivals.get(peer_id)
            if arrival is not None and not arrival.done() and self._offers.get(peer_id) is offer:
                arrival.set_exception(LinkClosed(f"could not connect to {peer_id}: {exc}", peer_id))
        finally:
            if self._offers.get(peer_id) is offer:
                del self._offers[peer_id]

    async def _answer(self, sender: str, signal: SignalData) -> None:
        if sender in self._answering:
            log.info("ignoring another offer from %s while answering its last", sender)
            return
        if self._shunned.left(sender):
            log.debug("ignoring an offer from %s: it broke the rules", sender)
            return
        self._answering.add(sender)
        try:
            await self._answer_offer(sender, signal)
        finally:
            self._answering.discard(sender)

    async def _answer_offer(self, sender: str, signal: SignalData) -> None:
        mine = self._offers.get(sender)
        if mine is not None:
            if self.me < sender:
                return  # glare: our offer wins, the other side will answer it
            del self._offers[sender]
            if not mine.answer.done():
                mine.answer.cancel()
        if sender not in self._links and not await self._make_room():
            log.warning("refusing an offer from %s: %d connections, all in use", sender, self.max_connections)
            return
        old = self._links.get(sender)
        if old is not None:
            await old.close()  # the other side thinks this link is dead: start over
        _remember(self._transports, sender, signal.transports, 4 * self.max_connections)
        transport = backends.for_answer(self.transports, signal.transport)
        connection, link = self._new_connection(sender, transport)
        try:
            sdp = await asyncio.wait_for(connection.answer(signal.sdp), self.connect_timeout)
            answer = _signal(SignalKind.ANSWER, signal.conn, sdp, connection, self.transports)
            await self._send_signal(sender, answer)
            await asyncio.wait_for(connection.opened(), self.connect_timeout)
        except BaseException as exc:
            await connection.close()
            arrival = self._arrivals.get(sender)
            if arrival is not None and not arrival.done() and not isinstance(exc, asyncio.CancelledError):
                arrival.set_exception(LinkClosed(f"could not connect to {sender}: {exc}", sender))
            raise
        self._adopt(link)

    async def _make_room(self) -> bool:
        """Whether the connection being answered fits (it counts among ``_answering``),
        closing the link idle longest if need be."""
        if len(self._links) + len(self._answering) + len(self._offers) <= self.max_connections:
            return True
        now = time.monotonic()
        idle = [link for link in self._links.values() if now - link.last_active > IDLE_LINK]
        if not idle:
            return False
        await min(idle, key=lambda link: link.last_active).close()
        return True

    def _adopt(self, link: PeerLink) -> None:
        if self._closing or link.broke_rules:
            self.spawn(link.close())
            return
        self._links[link.peer_id] = link
        self._redial.clear(link.peer_id)
        self.spawn(link.announce_path())
        log.debug("link to %s open", link.peer_id)
        if self.download_cap:
            self.spawn(self._advertise_limits())
        arrival = self._arrival(link.peer_id)
        if not arrival.done():
            arrival.set_result(link)

    def _overflowed(self, peer_id: str) -> None:
        link = self._links.get(peer_id)
        if link is not None:
            link.punish(f"more frames than anyone waits for ({self.mailbox.max_items} at most)")

    def _link_closed(self, link: PeerLink) -> None:
        if link.broke_rules:  # even before it was adopted: frames may come as the channel opens
            wait = self._shunned.extend(link.peer_id)
            log.warning("no links to %s for %.0f s: %s", link.peer_id, wait, link.broke_rules)
        if self._links.get(link.peer_id) is not link:
            return  # a connection attempt that lost a glare or never opened
        del self._links[link.peer_id]
        self._retired = self._retired + link.counters
        self.mailbox.fail_sender(link.peer_id, LinkClosed(f"link to {link.peer_id} closed", link.peer_id))
        if self.download_cap and not self._closing:
            self.spawn(self._advertise_limits())


async def _link_ahead(mesh: PeerMesh, peer_id: str) -> None:
    try:
        await mesh.link(peer_id)
    except LinkClosed as exc:
        log.info("could not link ahead to %s: %s", peer_id, exc)


def _retrieve(future: asyncio.Future) -> None:
    """Mark a failed arrival as seen: whoever waited for it has given up already."""
    if not future.cancelled():
        future.exception()


def _signal(kind: SignalKind, conn: str, sdp: str, connection: StackConnection,
            transports: list[Transport]) -> SignalData:
    """What a signal carries: the description, the stack it is for, and the stacks we have."""
    return SignalData(kind=kind, conn=conn, sdp=sdp, transport=connection.transport, transports=transports)


def _remember(stacks: dict[str, list[Transport]], peer_id: str, transports: list[Transport],
              most: int) -> None:
    """Which stacks ``peer_id`` has, for our next offer to it; the ``most`` heard last only
    (a stream of new identities must not grow it without end)."""
    stacks.pop(peer_id, None)
    stacks[peer_id] = transports
    if len(stacks) > most:
        del stacks[next(iter(stacks))]
