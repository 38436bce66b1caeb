"""When a round opens, and with whom: the proven peers' samples reach the target batch, no
joiner is still downloading the state (a wait that takes at most a twentieth of the time,
however many joiners come and go), and the group can all reach each other. Peers on probation join
the round as optional members: their parts are welcome, but nobody waits for them and
their word does not open it.

Auxiliary peers join every round whose members they all reach, as reducers only; one not
proven yet, only in a trial round (tracker/trials.py: short and rare)."""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.backbone.tracker.grouping import grouped_shares, link_claims
from engine.backbone.tracker.join_hold import JoinHold
from engine.backbone.tracker.membership import Members, Pace, PeerState
from engine.backbone.tracker.pairs import Pairs
from engine.backbone.tracker.trials import Trials
from engine.planning.load_balancing import Balance, balance, equal_shares, round_time
from engine.planning.partition import part_bounds
from engine.planning.slot_reducers import slot_reducers_now
from engine.project import ProjectSpec
from engine.wire.control import RoundDone, RoundStart
from engine.wire.groups import RoundGroups

if TYPE_CHECKING:
    from engine.backbone.tracker.part_checks import RoundAudit

log = logging.getLogger(__name__)
# A round the LP expects to move bytes for this long or more comes in PIECES parts per
# member's share, pipelined (planning/partition.py): on shaped home links, results flowing
# out while later pieces flow in brought rounds from 1.25-1.29x the LP's fluid prediction
# to 1.15x (tests/nat/test_shaped_links.py). Shorter rounds are latency, not bytes: one part
# each. So are rounds of groups so large that PIECES parts each would make commitments (a
# hash per part) large.
PIPELINE_FROM = 1.0
PIECES = 4
MAX_PIPELINED_PARTS = 256


# What a voter says the round's step produced: the state's hash, and its proof that it holds
# that state (RoundDone.proof). A peer that repeats the broadcast hash without the state
# cannot give the proof the others give: its vote is for another state.
Vote = tuple[str, str | None]


def vote(outcome: RoundDone) -> Vote | None:
    return (outcome.state_sha256, outcome.proof) if outcome.ok and outcome.state_sha256 else None


@dataclass
class OpenRound:
    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    opened_at: float
    deadline: float
    checkpoint_by: str | None
    members: dict[str, Pace]  # what each member had reported, refreshed during the round
    timeout: float  # what members are told a round may take (a trial's is shorter)
    optional: set[str] = field(default_factory=set)  # on probation: not waited for, no vote
    outcomes: dict[str, RoundDone] = field(default_factory=dict)
    settled_to: str | None = None  # the state hash a majority of members reported
    settled_vote: Vote | None = None  # ... with the proof they gave
    settled_at: float = 0.0
    first_success_at: float | None = None  # every member had stopped accumulating by then
    recovering: bool = False  # reopened after a restart: settles, credits nobody
    audit: RoundAudit | None = None  # the parts drawn for checking, once it has a majority state
    lost: set[str] = field(default_factory=set)  # members that left midway (tracker/backups.py)
    unproven: set[str] = field(default_factory=set)  # seen with samples; proven if its late step agrees
    reducers: list[str] = field(default_factory=list)  # who reduces part j now (a backup, if lost)
    auxiliary: set[str] = field(default_factory=set)  # reduce only: no gradient, no step, no vote
    trial: bool = False  # an unproven auxiliary peer reduces in it (tracker/trials.py)
    pieces: int = 1  # parts per member's share (planning/partition.py)
    # All-reduces per round: 2 in a PowerSGD project (P, then Q), whose part j of phase k is
    # part ``k * parts + j`` in commitments, draws and credit; same reducer for both.
    phases: int = 1
    answered_at: dict[str, float] = field(default_factory=dict)  # when each outcome arrived
    nonce: str = field(default_factory=lambda: secrets.token_hex(32))  # what voters prove the state with
    # A round of more than the project's group_size members runs in these groups; then
    # ``shares`` is each slot reducer's share of the vector (0 for the other members).
    groups: RoundGroups | None = None

    def __post_init__(self) -> None:
        if not self.reducers:
            self.reducers = [p for p in self.group for _ in range(self.pieces)]

    @property
    def parts(self) -> int:
        """Parts per phase."""
        return len(self.group) * self.pieces

    def share_of(self, part: int) -> float:
        """The fraction of its phase's vector part ``part`` holds."""
        return self.shares[part % self.parts // self.pieces] / self.pieces

    def reducer_of(self, part: int) -> str:
        """Who reduces part ``part`` now (a backup, if its member was lost), in any phase."""
        return self.reducers[part % self.parts]

    def lengths(self, holding: Vote) -> list[int]:
        """The vector's length as each voter that reports the state ``holding`` says it is
        (all alike, unless one lies: they hold one model)."""
        return [o.numel for p, o in self.outcomes.items()
                if p in self.voters and vote(o) == holding and o.numel > 0]

    def phase_lengths(self, holding: Vote) -> list[list[int]]:
        """Each phase's vector length as each voter that reports ``holding`` says it is
        (one phase: the vector's; a report with another number of phases is left out)."""
        said = [o.phase_numel or [o.numel] for p, o in self.outcomes.items()
                if p in self.voters and vote(o) == holding and o.numel > 0]
        return [lengths for lengths in said if len(lengths) == self.phases]

    def part_sizes(self, numel: int) -> list[int]:
        """The elements in each part of a vector of ``numel``: a share of a few millionths
        may hold none, and nobody reduces such a part."""
        return [hi - lo for lo, hi in part_bounds(numel, self.shares, self.pieces)]

    def wire_sizes(self, lengths: list[int]) -> list[int]:
        """The elements in each part of every phase, by the index it travels under."""
        return [size for numel in lengths for size in self.part_sizes(numel)]

    @property
    def voters(self) -> list[str]:
        """The members whose reports settle the round, and whom it waits for."""
        return [p for p in self.group
                if p not in self.optional and p not in self.lost and p not in self.auxiliary]

    def auxiliary_reducers(self) -> list[str]:
        """The auxiliary members that reduce a part now."""
        weights = self.weights()
        return [p for p in self.group if p in self.auxiliary and p not in self.lost and weights[p] > 0]

    def answered(self, alive: set[str], auxiliary: bool = True) -> bool:
        """Every voter still here has said how the round ended -- and, unless told not to
        wait for them any longer, every auxiliary member with a part (its report credits
        the parts it reduced, or names whose parts it missed)."""
        waited = [*self.voters, *(self.auxiliary_reducers() if auxiliary else [])]
        return all(p in self.outcomes or p not in alive for p in waited)

    def weights(self) -> dict[str, float]:
        """Each member's share of the vector: its weight as a reducer (a backup's includes
        the parts it took over)."""
        weights = dict.fromkeys(self.group, 0.0)
        for j, reducer in enumerate(self.reducers):
            weights[reducer] += self.share_of(j)
        return weights

    def caps(self) -> list[int]:
        """Per member, the most samples its parts count for (an auxiliary member sends none)."""
        return [self.members[p].cap if p in self.members else 0 for p in self.group]

    def start(self) -> RoundStart:
        return RoundStart(self.round_id, self.epoch, self.group, self.shares, self.timeout,
                          self.checkpoint_by, sorted(self.optional), sorted(self.auxiliary), self.pieces,
                          self.caps(), self.nonce, self.groups)

    def reducer_groups(self) -> list[tuple[set[str], dict[str, float]]]:
        """Who sends to whom: each group's members and its reducers' weights (a flat round:
        one group, every member)."""
        weights = self.weights()
        if self.groups is None:
            return [(set(self.group), weights)]
        return [(set(members), {r: weights[r] for r in reducers})
                for members, reducers in zip(self.groups.groups, self.slot_reducers(), strict=True)]

    def slot_reducers(self) -> list[list[str]]:
        """A grouped round's reducer of each slot in each group now: a backup of its group,
        if the one the round opened with was lost (``reducers`` says whose share it took)."""
        assert self.groups is not None
        return slot_reducers_now(self.groups.groups, self.groups.reducers, self.group, self.reducers)

    def holds_settled(self, outcome: RoundDone) -> bool:
        """Whether ``outcome`` reports the state the round settled on, with its proof."""
        return self.settled_vote is not None and vote(outcome) == self.settled_vote


class Scheduler:
    def __init__(self, project: ProjectSpec, members: Members, pairs: Pairs, clock: Callable[[], float], *,
                 retry_delay: float, join_grace: float, last_round_id: int,
                 equal_shares: bool = False) -> None:
        self.project = project
        self.members = members
        self.pairs = pairs
        self.retry_delay = retry_delay
        self.equal_shares = equal_shares
        self.join_grace = join_grace
        self._clock = clock
        self._retry_at = 0.0
        self._round_ids = itertools.count(last_round_id + 1)
        self._join_hold = JoinHold()
        self.trials = Trials(clock, retry_delay)
        self.vector_bytes = 0  # what a round moves per member, once a settled round told us
        # The counted samples of the peers that could average together, when too few for a
        # round (peers linked apart): the status says so, and they compute on.
        self.grouped_samples: int | None = None
        self._groups: RoundGroups | None = None  # the last round's, if it ran in groups
        # Per peer, what it owes for the checkpoint chore: (still uploading one, failed lately).
        self.chore_rank: Callable[[str, float | None], tuple[bool, int, float]] = \
            lambda peer, claimed: (False, 0, -(claimed or 0.0))

    def retry_later(self) -> None:
        """A round failed: give the peers a moment before the next."""
        self._retry_at = self._clock() + self.retry_delay

    def may_download(self, peer: PeerState, now: float) -> bool:
        """Whether a syncing peer's download is worth holding rounds for: not from a donor
        it is kept apart from, or whose last exchange with it failed."""
        donor = peer.donor
        return donor is None or (self.pairs.reachable(peer.peer_id, donor, now)
                                 and not self.pairs.failed_lately(peer.peer_id, donor))

    def open(self, epoch: int, last_checkpoint: int) -> OpenRound | None:
        """A round for ``epoch`` if one is due now (the caller knows none is open)."""
        now = self._clock()
        target = self.project.target_batch_size
        if now < self._retry_at:
            return None
        self.grouped_samples = None
        live = self.members.live(epoch)
        counted = self.members.counted(epoch)
        if not live or sum(p.samples for p in counted) < target:
            return None
        # A download still under way after a round's timeout holds the others no longer: its
        # donor may sit behind a link that died unnoticed (a NAT that rebound), and a
        # failed round would not have cost them more.
        hold = min(self.join_grace, self.project.round_timeout)
        downloading = any(p.syncing_since is not None and now - p.syncing_since < hold
                          and self.may_download(p, now) for p in self.members.peers.values())
        if self._join_hold.holds(now, downloading, hold):
            # A joiner is downloading the current state. Opening the round now would make
            # that state stale on arrival; the peers wait at the target meanwhile.
            return None
        proven = {p.peer_id for p in counted}
        trainers = self.pairs.connected_group(
            [(p.peer_id, p.samples if p.peer_id in proven else -1) for p in live], now)
        members = [p for p in live if p.peer_id in trainers]
        voters = [p for p in members if p.peer_id in proven]
        if not voters or sum(p.samples for p in voters) < target:
            self.grouped_samples = sum(p.samples for p in voters)
            return None
        optional = {p.peer_id for p in members} - proven
        sends_only = self.members.sends_only()
        helpers = self._auxiliaries(trainers, now, sends_only)
        auxiliary = {p.peer_id for p in helpers}
        group = sorted([*trainers, *auxiliary])
        size = self.project.group_size
        grouped = grouped_shares([*members, *helpers], group, optional, sends_only, size, self._groups,
                                 auxiliary) if size is not None and len(group) > size else None
        self._groups = grouped[0] if grouped is not None else None
        balanced = grouped[1] if grouped is not None else shares(
            [*members, *helpers], group, optional, self.equal_shares, auxiliary, sends_only)
        reducing = {r for g in grouped[0].reducers for r in g} if grouped is not None else set()
        idle = {p for p, share in zip(group, balanced.shares, strict=True)
                if p in auxiliary and share == 0 and p not in reducing}
        if idle:  # the LP found their links no help: they sit this round out
            kept = [(p, s) for p, s in zip(group, balanced.shares, strict=True) if p not in idle]
            group, auxiliary = [p for p, _ in kept], auxiliary - idle
            balanced = Balance([s for _, s in kept], balanced.seconds)
        trial = any(not p.proven for p in helpers if p.peer_id in auxiliary)
        if trial:
            self.trials.opened()
        timeout = self.trials.timeout(self.project.round_timeout) if trial else self.project.round_timeout
        due = epoch + 1 - last_checkpoint >= self.project.checkpoint_every
        predicted = balanced.seconds * self.vector_bytes
        phases = 2 if self.project.compression == "powersgd" else 1
        # (commitments list every part of every phase: PowerSGD pipelines groups half as large)
        pipelined = predicted >= PIPELINE_FROM and phases * len(group) * PIECES <= MAX_PIPELINED_PARTS
        rnd = OpenRound(
            round_id=next(self._round_ids), epoch=epoch, group=group, shares=balanced.shares,
            opened_at=now, deadline=now + timeout, timeout=timeout,
            checkpoint_by=checkpointer(members, proven, self.chore_rank) if due else None,
            members=self.members.paces(members, now), optional=optional,
            auxiliary=auxiliary, trial=trial, pieces=PIECES if pipelined and not grouped else 1,
            phases=phases,
            groups=grouped[0] if grouped is not None else None,
        )
        log.info("%s: round %d for epoch %d with %d peers (%d auxiliary), %d samples, shares %s in %d "
                 "pieces (%.3f s per MB, %.1f s predicted)", self.project.id, rnd.round_id, rnd.epoch,
                 len(group), len(auxiliary), sum(m.samples for m in rnd.members.values()),
                 " ".join(f"{s:.2f}" for s in rnd.shares), rnd.pieces, balanced.seconds * 1e6, predicted)
        return rnd

    def round_over(self, rnd: OpenRound) -> None:
        settled_at = rnd.settled_at if rnd.settled_to is not None else None
        self.trials.round_over(rnd.opened_at, settled_at, rnd.trial)

    def _auxiliaries(self, trainers: list[str], now: float, sends_only: set[str]) -> list[PeerState]:
        """The auxiliary peers that join a round of ``trainers``: those that reach them all
        and accept connections; of those not proven yet, one, if a trial is due."""
        chosen = []
        trial_due = self.trials.due(now)
        for peer in self.members.auxiliaries():
            reaches = all(self.pairs.reachable(peer.peer_id, t, now) for t in trainers)
            if peer.peer_id in sends_only or not reaches:
                continue
            if peer.proven:
                chosen.append(peer)
            elif trial_due:
                chosen.append(peer)
                trial_due = False
        return chosen


def checkpointer(members: list[PeerState], proven: set[str],
                 rank: Callable[[str, float | None], tuple[bool, int, float]]) -> str:
    """Who uploads the state a round settles on: a voter not still uploading an earlier
    one and with the fewest failed since its last stored, the fastest uplink first (a state
    is the model and its optimizer's moments: hundreds of MB on a home uplink), as its last
    stored upload showed it or, before one, as claimed (CheckpointRequests.rank). A claim of
    speed buys only the chore; one that does not deliver ranks behind those that do."""
    voters = [p for p in members if p.peer_id in proven]
    return min(voters, key=lambda p: (*rank(p.peer_id, p.upload), p.peer_id)).peer_id


def shares(members: list[PeerState], group: list[str], optional: set[str], equal: bool = False,
           auxiliary: set[str] | frozenset[str] = frozenset(),
           sends_only: set[str] | frozenset[str] = frozenset()) -> Balance:
    """Each member's share of the vector, by DeDLOC's LP over the links the members report.
    Auxiliary members bring no gradient: they only reduce.
    Peers in ``sends_only`` (Members.sends_only: client mode, or parts checkers could not
    get lately) reduce nothing (unless all voters are), nor do members on probation.
    A member that has not measured its link counts as the median of those that have (all
    equal: equal shares); a claim beyond MAX_CLAIM_RATIO times that median (or below its
    inverse) counts as that much: in a group of more than MAX_CLAIM_RATIO + 1 a stranger
    cannot make itself the only reducer by saying it is fast.
    ``equal``: every reducer the same share, as before DeDLOC's LP (to compare)."""
    links = link_claims(members, group, optional, auxiliary, sends_only)
    if not equal:
        try:
            return balance(links, 1.0)
        except (ArithmeticError, ValueError) as exc:
            log.warning("round shares: the LP failed (%s); equal shares this round", exc)
    even = equal_shares(links)
    return Balance([s / sum(even) for s in even], round_time(even, links, 1.0))
