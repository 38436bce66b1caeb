"""One butterfly all-reduce round over the peer mesh.

Every peer owns one contiguous share of the flat gradient, in ``pieces`` parts. It sends
each part of its accumulated sum to that part's reducer, reduces its own parts from
everyone's contributions, and sends each averaged part back to all as soon as it is done
(so results flow out while later parts still flow in). Each part is reduced exactly once,
so every peer (the reducer included) applies the very same bits.

Auxiliary members (``RoundPlan.auxiliary``: peers with bandwidth but no useful compute)
bring no gradient: they reduce their part (``aggregate_parts``) and take no step, so nobody
waits for a part from them or sends them results.

Members on probation (``RoundPlan.optional``: newcomers, or members that missed a round)
reduce nothing, and their parts are taken only if they come while the round lasts anyway:
a silent or slow stranger costs the others a short grace, never the round. A part that
breaks the rules is dropped and costs its sender its share, never the round. Nor does a
peer that reads slowly hold a reducer: results go out in the background, and the round
ends for the reducer a short grace after it holds every result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from engine.averaging import compression
from engine.averaging.recheck import part_digest, result_digest
from engine.averaging.robust import Aggregate, Contribution, aggregate, typical_loss
from engine.planning.partition import part_bounds
from engine.project import AggregationSpec, CompressionMethod
from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mailbox import Key, Kind
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.control import Commitment, Committed, PartInputs, RoundStart
from engine.wire.frames import Part, Result, Shown
from engine.wire.framing import Frame
from engine.wire.types import total_count

log = logging.getLogger(__name__)

# Once the parts a reducer must have are in, optional parts still under way get as long
# again as the round took so far, at least this long: time enough for an honest newcomer
# on a link like the others', little for a silent one to cost. Results still being sent
# when the round is done get as long before the round returns (and go on after).
GRACE = 0.1
# A link to a member that died may close before the backbone says the member left: wait
# this long for its word (a Reassign) before the round fails. A killed peer's control
# socket closes with its process, and the word arrives in a tenth of a second; a link that
# dies under a peer still connected to the backbone (its NAT rebound) must fail the round
# well before its deadline, naming that peer, so the tracker keeps the pair apart.
VERDICT_WAIT = 2.0


class AveragingError(RuntimeError):
    """The round could not complete on this peer (a peer vanished, a deadline passed).
    ``suspects``: the peers it could not exchange with, for the tracker to keep apart;
    ``waiting``: the reducers whose results had not come."""

    def __init__(self, message: str, suspects: Iterable[str] = (), waiting: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.suspects = sorted(suspects)
        self.waiting = sorted(waiting)


class Misbehaved(ProtocolError):
    """What ``peer`` sent breaks the round's rules: it, and no one else, is to blame."""

    def __init__(self, peer: str, message: str) -> None:
        super().__init__(message)
        self.peer = peer


class RoundChanges:
    """The backbone's word on members lost midway through a round (control: Reassign), as
    it comes: whom to wait for no longer, and who reduces each part now."""

    def __init__(self) -> None:
        self.lost: frozenset[str] = frozenset()
        self.reducers: list[str] | None = None
        self._changed = asyncio.Event()

    def update(self, lost: Iterable[str], reducers: list[str]) -> None:
        self.lost, self.reducers = frozenset(lost), list(reducers)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self) -> None:
        """Until the next update."""
        await self._changed.wait()


@dataclass
class RoundPlan:
    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    me: str
    optional: frozenset[str] = frozenset()
    aggregation: AggregationSpec = field(default_factory=AggregationSpec)
    target_batch_size: int = 10**9  # a sender's claimed samples weigh at most a share of it
    compression: CompressionMethod = "none"  # of parts and results on the wire
    changes: RoundChanges = field(default_factory=RoundChanges)
    auxiliary: frozenset[str] = frozenset()  # members that reduce and bring no gradient
    pieces: int = 1  # parts per member's share: part j is member j // pieces's
    caps: dict[str, int] = field(default_factory=dict)  # the most samples a member's part counts for

    @classmethod
    def of(cls, start: RoundStart, me: str, aggregation: AggregationSpec, target_batch_size: int,
           compression: CompressionMethod, changes: RoundChanges | None = None) -> RoundPlan:
        """The round the backbone opened, as ``me`` takes part in it."""
        return cls(start.round_id, start.epoch, start.group, start.shares, me, frozenset(start.optional),
                   aggregation, target_batch_size, compression, changes or RoundChanges(),
                   frozenset(start.auxiliary), start.pieces,
                   dict(zip(start.group, start.caps, strict=True)) if start.caps else {})

    @property
    def my_index(self) -> int:
        return self.group.index(self.me)

    @property
    def parts(self) -> int:
        return len(self.group) * self.pieces

    def owner(self, part: int) -> str:
        """The member a part was given to when the round opened."""
        return self.group[part // self.pieces]

    @property
    def senders(self) -> list[str]:
        """The members that bring a gradient, in group order."""
        return [p for p in self.group if p not in self.auxiliary]

    @property
    def verified(self) -> bool:
        """Whether reducers may be checked: then members commit to what they did."""
        return self.aggregation.verify_probability > 0


CommittedPart = tuple[Committed, torch.Tensor]  # a part as its reducer took it, and its hash


@dataclass
class Reduced:
    """The part this peer reduced, kept until its round settles in case it is checked."""

    round_id: int
    index: int
    inputs: list[CommittedPart]
    result: torch.Tensor


@dataclass
class Averaged:
    vector: torch.Tensor
    samples: int
    loss: float | None
    received: dict[str, int]  # sender -> samples its part to me carried (empty: I reduced nothing)
    commitment: Commitment | None = None  # when the project checks reducers
    reduced: list[Reduced] = field(default_factory=list)  # the same: each part I reduced


@dataclass
class ReducedParts:
    """What an auxiliary member did in a round: it reduced parts and applied nothing."""

    results: list[Result]  # one per part it reduced
    received: dict[str, int]  # sender -> samples its parts to me carried
    commitment: Commitment | None = None
    reduced: list[Reduced] = field(default_factory=list)
    bytes_in: int = 0  # payload bytes of the parts it combined


async def butterfly_allreduce(
    plan: RoundPlan,
    local_sum: torch.Tensor,
    samples: int,
    loss_sum: float,
    mesh: PeerMesh,
    timeout: float,
) -> Averaged:
    """Average ``local_sum`` (gradient x samples, flat fp32) with the group's; raise AveragingError."""
    round_ = _Round(plan, local_sum.detach().contiguous().view(-1), samples, loss_sum, mesh, timeout)
    try:
        return await asyncio.wait_for(round_.run(), timeout)
    except asyncio.TimeoutError:
        raise AveragingError(f"round {plan.round_id} did not finish within {timeout:.0f}s",
                             round_.suspects(), round_.waiting()) from None
    except LinkClosed as exc:
        suspects = {exc.peer} if exc.peer else round_.suspects()
        raise AveragingError(f"round {plan.round_id}: {exc}", suspects, round_.waiting()) from None
    except Misbehaved as exc:
        raise AveragingError(f"round {plan.round_id}: {exc}", {exc.peer}, round_.waiting()) from None


async def aggregate_parts(plan: RoundPlan, numel: int, mesh: PeerMesh, timeout: float) -> ReducedParts:
    """As an auxiliary member of the round: reduce the parts of a ``numel``-element vector
    that are ours and send the results to everyone who brought a gradient; raise
    AveragingError."""
    round_ = _Round(plan, None, 0, 0.0, mesh, timeout, numel=numel)
    try:
        return await asyncio.wait_for(round_.run_auxiliary(), timeout)
    except asyncio.TimeoutError:
        raise AveragingError(f"round {plan.round_id} did not finish within {timeout:.0f}s",
                             round_.suspects()) from None
    except LinkClosed as exc:
        suspects = {exc.peer} if exc.peer else round_.suspects()
        raise AveragingError(f"round {plan.round_id}: {exc}", suspects) from None


@dataclass
class _Round:
    """One round as this peer lives it: connect, send parts, reduce its own part (and any
    it takes over from a lost member), collect the others' results."""

    plan: RoundPlan
    flat: torch.Tensor | None  # our gradient sum (None: an auxiliary member brings none)
    samples: int
    loss_sum: float
    mesh: PeerMesh
    timeout: float
    numel: int = 0  # the vector's length, when we bring no vector
    links: dict[str, PeerLink] = field(default_factory=dict)
    # Whom the round still waits for. A missing link or part points at that peer; a missing
    # result does not: its reducer may itself be waiting on someone else, and blaming it would
    # keep apart peers that reach each other fine (the reducer's own report names the culprit).
    missing_links: set[str] = field(default_factory=set)
    missing_parts: dict[int, set[str]] = field(default_factory=dict)  # per part I reduce
    closed: set[str] = field(default_factory=set)  # whose link closed under the round
    result_sends: list[asyncio.Future] = field(default_factory=list)
    last_result: dict[str, asyncio.Future] = field(default_factory=dict)  # per peer, the latest
    sent: dict[int, str] = field(default_factory=dict)  # part index -> hash of ours (if verified)
    shown: dict[int, str] = field(default_factory=dict)  # part index -> its reducer's own, as shown us
    applied: dict[int, str] = field(default_factory=dict)  # part index -> hash of its result
    reduced: list[Reduced] = field(default_factory=list)  # what I reduced (if verified)
    mine: list[Result] = field(default_factory=list)  # my results, one per part I reduced
    bytes_in: int = 0  # payload bytes of the parts I combined
    results_in: set[int] = field(default_factory=set)  # parts whose result we hold

    def __post_init__(self) -> None:
        plan = self.plan
        if self.flat is not None:
            self.numel = self.flat.numel()
        self.bounds = part_bounds(self.numel, plan.shares, plan.pieces)
        self.sends = self.flat is not None
        share = [sum(self.size(j) for j in range(m * plan.pieces, (m + 1) * plan.pieces))
                 for m in range(len(plan.group))]
        self.reduces = share[plan.my_index] > 0
        # Whom this peer exchanges with: the reducers (its parts out, results back) and, if
        # it reduces, every member that brings a gradient. Optional partners are never
        # waited for.
        self.partners = [p for m, p in enumerate(plan.group)
                         if p != plan.me and ((self.sends and share[m]) or
                                              (self.reduces and p not in plan.auxiliary))]
        self.required = [p for p in self.partners if p not in plan.optional]
        # A reducer's parts go to it in order, each whole before the next: it can reduce the
        # first while the others come (``send_part`` waits for its turn).
        self.turns = [asyncio.Event() for _ in range(plan.parts)]
        # Every part's result lands here (an auxiliary member applies nothing: it keeps none).
        self.averaged = torch.empty(self.numel if self.sends else 0, dtype=torch.float32)
        self.began = asyncio.get_running_loop().time()

    def suspects(self) -> set[str]:
        return (self.missing_links | self.closed | set().union(*self.missing_parts.values())) - self.lost

    def waiting(self) -> set[str]:
        """The reducers whose results we still lack (none: an auxiliary member needs none)."""
        if not self.sends:
            return set()
        reducers = self.reducers
        return {reducers[j] for j in range(len(reducers))
                if self.size(j) and j not in self.results_in and reducers[j] != self.plan.me} - self.lost

    def ours(self, j: int) -> bool:
        """Whether part ``j`` was given to us when the round opened."""
        return self.plan.owner(j) == self.plan.me

    def size(self, j: int) -> int:
        lo, hi = self.bounds[j]
        return hi - lo

    @property
    def reducers(self) -> list[str]:
        """Who reduces part j: its member, or the backup the backbone named once it was lost."""
        plan = self.plan
        given = plan.changes.reducers
        if given is not None and len(given) == plan.parts and set(given) <= set(plan.group):
            return given
        return [plan.owner(j) for j in range(plan.parts)]

    @property
    def lost(self) -> frozenset[str]:
        """The members the backbone says left midway (RoundChanges)."""
        return (self.plan.changes.lost & frozenset(self.plan.group)) - {self.plan.me}

    async def _until_done(self, waits: Mapping[str, asyncio.Future], needed: Iterable[str]) -> None:
        """Until the waits of the ``needed`` peers are done -- or those peers are lost: a
        member that left midway is waited for no longer, and its failures are not ours."""
        needed = list(needed)
        while True:
            for p in needed:
                w = waits[p]
                failed = p not in self.lost and w.done() and not w.cancelled() and w.exception() is not None
                if failed and not await self._lost_soon(p):
                    raise w.exception()  # type: ignore[misc]
            pending = [waits[p] for p in needed if p not in self.lost and not waits[p].done()]
            if not pending:
                return
            await self._any_or_news(pending)

    async def _any_or_news(self, futures: list[asyncio.Future]) -> None:
        """Until one of ``futures`` is done, or the backbone's word on lost members changes."""
        news = asyncio.ensure_future(self.plan.changes.wait())
        try:
            await asyncio.wait([*futures, news], return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()

    async def _lost_soon(self, peer: str) -> bool:
        """Whether the backbone says ``peer`` left, within VERDICT_WAIT (its link failed;
        if the round's deadline comes first, the peer is still named as the suspect)."""
        self.closed.add(peer)
        loop = asyncio.get_running_loop()
        until = loop.time() + VERDICT_WAIT
        while peer not in self.lost and loop.time() < until:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.plan.changes.wait(), until - loop.time())
        return peer in self.lost

    async def run_auxiliary(self) -> ReducedParts:
        """Reduce our parts (the backbone never hands an auxiliary member a lost one's)."""
        await self.connect()
        await _all_or_none([self.reduce(j) for j in range(self.plan.parts) if self.ours(j) and self.size(j)])
        await self._results_sent()
        return ReducedParts(self.mine, _seen_in_all(self.mine), self._commitment(), self.reduced,
                            self.bytes_in)

    async def run(self) -> Averaged:
        await self.connect()
        results = await _all_or_none([self.exchange(j) for j in range(self.plan.parts) if self.size(j)])
        await self._results_sent()
        return self.outcome(results)

    async def _results_sent(self) -> None:
        """Our results out, or as long again as the round took (they go on after)."""
        if self.result_sends:
            now = asyncio.get_running_loop().time()
            await asyncio.wait(self.result_sends, timeout=max(GRACE, now - self.began))

    def _commitment(self) -> Commitment | None:
        """What we did, for projects that check reducers: the parts we sent and the results
        we applied (by part), and what we combined for each part we reduced."""
        if not self.plan.verified:
            return None
        parts = range(self.plan.parts)
        return Commitment(sent=[self.sent.get(j) for j in parts] if self.sends else [],
                          results=[self.applied.get(j) for j in parts] if self.sends else [],
                          reduced=[PartInputs(index=r.index, inputs=[c for c, _ in r.inputs])
                                   for r in sorted(self.reduced, key=lambda r: r.index)],
                          shown=[self.shown.get(j) for j in parts] if self.sends else [])

    async def connect(self) -> None:
        self.missing_links = set(self.required)
        for j in range(self.plan.parts):  # a part nobody sends over a link is nobody's turn to wait on
            if not self.sends or self.ours(j) or not self.size(j):
                self.turns[j].set()

        async def connect(peer: str) -> None:
            self.links[peer] = await self.mesh.link(peer)
            self.missing_links.discard(peer)

        waits = {p: asyncio.ensure_future(connect(p)) for p in self.required}
        try:
            await self._until_done(waits, self.required)
        finally:
            for wait in waits.values():
                if not wait.done():
                    wait.cancel()
                wait.add_done_callback(_quiet)

    async def exchange(self, j: int) -> Result:
        """Part ``j``: reduce it, if it is ours to; else send it to its reducer and take the
        result back -- from a backup, if the backbone hands the part to one meanwhile."""
        while True:
            reducer = self.reducers[j]
            if reducer == self.plan.me:
                self.turns[j].set()  # (a part handed to us: we do not send it)
                return await self.reduce(j)
            work = asyncio.ensure_future(self.send_and_receive(j, reducer))
            try:
                while True:
                    await self._any_or_news([work])
                    if work.done() and not (isinstance(work.exception(), LinkClosed)
                                            and await self._lost_soon(reducer)):
                        return work.result()
                    if self.reducers[j] != reducer:
                        log.info("round %d: part %d goes to %s now (%s left)", self.plan.round_id, j,
                                 self.reducers[j], reducer)
                        break
                    if reducer in self.lost:
                        raise AveragingError(f"round {self.plan.round_id}: {reducer} left, and nobody "
                                             f"took over part {j}")
            finally:
                if not work.done():
                    work.cancel()
                work.add_done_callback(_quiet)

    async def send_and_receive(self, j: int, reducer: str) -> Result:
        link = self.links.get(reducer)
        if link is None:  # a backup we had no link to
            link = self.links[reducer] = await self.mesh.link(reducer)
        results = asyncio.ensure_future(self.receive_result(j, reducer))
        try:
            await self.send_part(j, link)
            return await results
        finally:
            if not results.done():
                results.cancel()
            results.add_done_callback(_quiet)

    async def send_part(self, j: int, link: PeerLink) -> None:
        assert self.flat is not None
        lo, hi = self.bounds[j]
        header = Part(round_id=self.plan.round_id, epoch=self.plan.epoch, index=j, samples=self.samples,
                      loss_sum=self.loss_sum)
        payload: bytes | memoryview = b""
        try:
            if self.samples > 0:
                payload = self.flat[lo:hi].numpy().data
                if self.plan.compression != "none":
                    payload = await asyncio.to_thread(compression.encode, self.flat[lo:hi],
                                                      self.plan.compression)
            if self.plan.verified:
                # Committed as the reducer will take it: decoded.
                self.sent[j] = await asyncio.to_thread(
                    part_digest, self.samples, self._decode(payload, hi - lo) if payload else None)
                # Nothing goes to a checked reducer before it has fixed its own part.
                self.shown[j] = await self._shown(j, link.peer_id)
            if j % self.plan.pieces:
                await self.turns[j - 1].wait()  # the reducer's previous piece is on its way
            await link.send(header, payload)
        finally:
            self.turns[j].set()

    async def _shown(self, j: int, reducer: str) -> str:
        """The hash of its own part ``j`` that its reducer committed to."""
        frame = await self.mesh.mailbox.get(round_key("shown", self.plan.round_id, j, reducer), timeout=1e9)
        shown = frame.header
        if not isinstance(shown, Shown) or shown.epoch != self.plan.epoch or shown.index != j:
            raise Misbehaved(reducer, f"{reducer} showed its part {j} for another round")
        return shown.sha256

    async def _show_own(self, j: int) -> None:
        """As part ``j``'s reducer, in a checked project: commit to our own part to every
        sender before taking theirs (we cannot pick it once we know what they sent)."""
        lo, hi = self.bounds[j]
        own = self.flat[lo:hi] if self.flat is not None and self.samples > 0 else None
        digest = await asyncio.to_thread(part_digest, self.samples if own is not None else 0, own)
        header = Shown(round_id=self.plan.round_id, epoch=self.plan.epoch, index=j, sha256=digest)
        for peer in self.plan.senders:
            if peer != self.plan.me and peer not in self.lost:
                self.result_sends.append(self.mesh.spawn(self._send_to(peer, header, b"")))

    def _decode(self, payload: bytes | memoryview, n: int) -> torch.Tensor | memoryview | bytes:
        method = self.plan.compression
        try:
            return payload if method == "none" else compression.decode(payload, n, method)
        except ValueError:
            return payload  # a part that is not finite: its reducer leaves it out, uncommitted

    async def receive_part(self, j: int, peer: str) -> tuple[torch.Tensor | None, int, float] | None:
        """The part ``j`` that ``peer`` sent me, or None if it broke the rules (then it is left
        out, and so are its samples: it is the only one to pay)."""
        frame = await self.mesh.mailbox.get(round_key("part", self.plan.round_id, j, peer), timeout=1e9)
        self.missing_parts.get(j, set()).discard(peer)
        self.bytes_in += len(frame.payload)
        try:
            part = frame.header
            if not isinstance(part, Part) or part.epoch != self.plan.epoch or part.index != j:
                raise Misbehaved(peer, f"part from {peer} is not for this epoch's part {j}")
            values = await self._values(frame, self.size(j), peer, "part")
            if (values is None) != (part.samples == 0):
                raise Misbehaved(peer, f"part from {peer} has samples={part.samples} but no values")
        except Misbehaved as exc:
            log.warning("round %d: leaving out %s", self.plan.round_id, exc)
            return None
        return values, part.samples, part.loss_sum

    async def gather_parts(self, j: int) -> dict[str, tuple[torch.Tensor | None, int, float]]:
        """Every required sender's part ``j`` (a link lost fails the round, unless the
        backbone says its peer left), then what optional senders deliver within the grace.
        A lost member's part is left out: the round is the live members'."""
        senders = [p for p in self.plan.senders if p != self.plan.me]
        required = [p for p in senders if p not in self.plan.optional]
        self.missing_parts[j] = set(required)
        waits = {p: asyncio.ensure_future(self.receive_part(j, p)) for p in senders}
        try:
            await self._until_done(waits, required)
            optional = [w for p, w in waits.items() if p not in required and p not in self.lost]
            if optional:
                now = asyncio.get_running_loop().time()
                await asyncio.wait(optional, timeout=max(GRACE, now - self.began))
        finally:
            for wait in waits.values():
                if not wait.done():
                    wait.cancel()
                wait.add_done_callback(_quiet)
        arrived = {p: w.result() for p, w in waits.items()
                   if p not in self.lost and w.done() and not w.cancelled() and w.exception() is None}
        return {p: part for p, part in arrived.items() if part is not None}

    async def reduce(self, j: int) -> Result:
        """Add the senders' parts ``j`` in group order (so every reducer handed the same
        inputs gets the same bits), divide by their samples, send the result to everyone."""
        if self.plan.verified:
            await self._show_own(j)
        parts = await self.gather_parts(j)
        lo, hi = self.bounds[j]
        if self.flat is not None:
            own = self.flat[lo:hi] if self.samples > 0 else None
            parts[self.plan.me] = (own, self.samples, self.loss_sum)
        contributions = [Contribution(p, values, samples) for p in self.plan.group if p in parts
                         for values, samples, _ in [parts[p]] if values is not None]
        try:
            # Off the event loop: CenteredClip of a large part takes seconds, and the links'
            # SCTP and DTLS run on this loop.
            combined, inputs = await asyncio.to_thread(self._combine, contributions)
        except ValueError as exc:
            raise AveragingError(f"round {self.plan.round_id}: no part to reduce ({exc})") from None
        for sender, why in combined.rejected.items():
            log.warning("round %d: leaving out the part of %s: %s", self.plan.round_id, sender, why)
        for c in contributions:
            if combined.weights.get(c.sender, c.samples) < c.samples:
                log.info("round %d: counting %d of the %d samples %s claims (its cap)", self.plan.round_id,
                         combined.weights[c.sender], c.samples, c.sender)
        reduced = combined.values
        payload: bytes | memoryview = reduced.numpy().data
        if self.plan.compression != "none":
            # Everyone, this reducer too, applies the result as it travels.
            try:
                payload, reduced = await asyncio.to_thread(self._compressed, reduced)
            except ValueError as exc:
                raise AveragingError(f"round {self.plan.round_id}: result not encodable ({exc})") from None
        if self.plan.verified:
            self.reduced.append(Reduced(self.plan.round_id, j, inputs, reduced))
            if self.sends:
                self.applied[j] = await asyncio.to_thread(result_digest, reduced)
        if self.sends:
            self.averaged[lo:hi] = reduced
        weights = combined.weights
        loss = typical_loss({p: parts[p][2] / parts[p][1] for p in weights})
        # A part with no samples (a slow device that finished no micro-batch) was still
        # delivered: the backbone must see its sender took part, or it strikes it.
        received = {p: 0 for p, (values, _, _) in parts.items() if values is None} | weights
        result = Result(round_id=self.plan.round_id, epoch=self.plan.epoch, index=j,
                        samples=total_count(weights.values()), loss=loss, received=received)
        self.mine.append(result)
        for peer in self.plan.senders:
            if peer != self.plan.me and peer not in self.lost:
                # One result at a time to each peer, in piece order: with our own parts on the
                # same link, that keeps what we have under way within its Reassembler's limit.
                send = self.mesh.spawn(self._send_result(peer, result, payload, self.last_result.get(peer)))
                self.last_result[peer] = send
                self.result_sends.append(send)
        return result

    def _combine(self, contributions: list[Contribution]) -> tuple[Aggregate, list[CommittedPart]]:
        """Aggregate; in a verified project, also hash what went in."""
        plan = self.plan
        combined = aggregate(contributions, plan.aggregation, plan.target_batch_size, plan.caps)
        inputs = [(_committed(c), c.values) for c in contributions] if self.plan.verified else []
        return combined, inputs

    def _compressed(self, values: torch.Tensor) -> tuple[bytes, torch.Tensor]:
        payload = compression.encode(values, self.plan.compression)
        return payload, compression.decode(payload, values.numel(), self.plan.compression)

    async def _values(self, frame: Frame, expected: int, peer: str, what: str) -> torch.Tensor | None:
        """The fp32 values a part or result carries (None: an empty part)."""
        method = self.plan.compression
        if method == "none" or len(frame.payload) == 0:
            return _as_floats(frame, expected, peer, what)
        try:
            return await asyncio.to_thread(compression.decode, frame.payload, expected, method)
        except ValueError as exc:
            raise Misbehaved(peer, f"{what} from {peer}: {exc}") from None

    async def _send_result(self, peer: str, result: Result, payload: bytes | memoryview,
                           after: asyncio.Future | None) -> None:
        """Our result for ``peer``, once the one before it (``after``) is sent."""
        if after is not None:
            await asyncio.wait({after})
        await self._send_to(peer, result, payload)

    async def _send_to(self, peer: str, header: Result | Shown, payload: bytes | memoryview) -> None:
        """A frame for ``peer`` within the round's time (an optional member's link may still
        be opening); one that cannot go is logged, and costs the round nothing here."""
        remaining = self.timeout - (asyncio.get_running_loop().time() - self.began)
        try:
            link = self.links.get(peer)
            if link is None:
                link = await asyncio.wait_for(self.mesh.link(peer), max(remaining, 0.0))
            await asyncio.wait_for(link.send(header, payload), max(remaining, 1.0))
        except (asyncio.TimeoutError, LinkClosed, ProtocolError) as exc:
            log.info("round %d: no %s for %s (%s)", self.plan.round_id, header.__struct_config__.tag, peer,
                     exc or "timeout")

    async def receive_result(self, j: int, peer: str) -> Result:
        frame = await self.mesh.mailbox.get(round_key("result", self.plan.round_id, j, peer), timeout=1e9)
        result = frame.header
        if not isinstance(result, Result) or result.epoch != self.plan.epoch or result.index != j:
            raise Misbehaved(peer, f"result from {peer} is not for this epoch's part {j}")
        values = await self._values(frame, self.size(j), peer, "result")
        if values is None:
            raise Misbehaved(peer, f"result from {peer} is empty")
        lo, hi = self.bounds[j]
        self.averaged[lo:hi] = values
        self.results_in.add(j)
        if self.plan.verified:
            self.applied[j] = await asyncio.to_thread(result_digest, values)
        return result

    def outcome(self, results: list[Result]) -> Averaged:
        """What the round amounts to. Reducers may have taken different optional parts, and
        one may lie in its header: the round's samples and loss are the median of what the
        reducers say, the same on every peer handed the same results."""
        if not results:
            raise AveragingError("nobody reduced anything")
        senders = {s for r in results for s in r.received}
        samples = total_count(statistics.median_low(r.received.get(s, 0) for r in results) for s in senders)
        losses = [r.loss for r in results if r.loss is not None]
        return Averaged(self.averaged, samples, statistics.median_low(losses) if losses else None,
                        _seen_in_all(self.mine), self._commitment(), self.reduced)


def round_key(kind: Kind, round_id: int, index: int, sender: str) -> Key:
    """Where a part or result waits in the mailbox: per part, as a backup reducer gets two
    parts of one round from each sender."""
    return Key(kind, round_id, (index,), sender)


def _seen_in_all(mine: list[Result]) -> dict[str, int]:
    """Per sender, the samples its parts to me carried: in every part I reduced (a sender
    that skipped one did not take part in full), the fewest."""
    if not mine:
        return {}
    senders = set.intersection(*(set(r.received) for r in mine))
    return {s: min(r.received[s] for r in mine) for s in sorted(senders)}


def _committed(c: Contribution) -> Committed:
    return Committed(sender=c.sender, samples=c.samples, sha256=part_digest(c.samples, c.values))


def _as_floats(frame: Frame, expected: int, peer: str, what: str) -> torch.Tensor | None:
    if len(frame.payload) == 0:
        return None
    if len(frame.payload) != expected * 4:
        raise Misbehaved(peer, f"{what} from {peer}: {len(frame.payload)} bytes, expected {expected * 4}")
    return torch.frombuffer(frame.payload, dtype=torch.float32)


async def _all_or_none(coros: list) -> list:
    """Their results, in order; if one fails, the rest are cancelled and its error raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
            task.add_done_callback(_quiet)
        raise


def _quiet(future: asyncio.Future) -> None:
    """Abandoned halves of a failed round: their errors are the round's, already reported."""
    if not future.cancelled():
        future.exception()
