"""Each member of a round as the backbone's LPs see it, and a round too large to run flat
planned in groups (planning/groups.py): its RoundGroups and each slot reducer's share."""

from __future__ import annotations

import logging
import statistics

from engine.backbone.tracker.membership import PeerState
from engine.planning.groups import plan_groups
from engine.planning.load_balancing import Balance, Member
from engine.wire.groups import RoundGroups

log = logging.getLogger(__name__)
# A member's reported link counts for at most this many times the group's median.
MAX_CLAIM_RATIO = 16.0


def link_claims(members: list[PeerState], group: list[str], optional: set[str],
                auxiliary: set[str] | frozenset[str] = frozenset(),
                sends_only: set[str] | frozenset[str] = frozenset()) -> list[Member]:
    """Each member of ``group`` as the LP sees it: its claimed links within bounds, and its role."""
    by_id = {p.peer_id: p for p in members}
    client = {p for p in group if p in sends_only} | optional
    if client >= set(group) - optional:
        client = optional
    reported = [rate for p in members for rate in (p.upload, p.download) if rate]
    typical = statistics.median(reported) if reported else 1.0

    def rate(value: float | None) -> float:
        # Within MAX_CLAIM_RATIO of the median either way: keeps the LP well conditioned.
        return min(max(value or typical, typical / MAX_CLAIM_RATIO), typical * MAX_CLAIM_RATIO)

    return [Member(rate(by_id[peer].upload), rate(by_id[peer].download), sends=peer not in auxiliary,
                   reduces=peer not in client) for peer in group]


def grouped_shares(members: list[PeerState], group: list[str], optional: set[str], sends_only: set[str],
                   group_size: int, last: RoundGroups | None = None,
                   auxiliary: set[str] | frozenset[str] = frozenset()) -> tuple[RoundGroups, Balance] | None:
    """A round of ``group`` in groups of about ``group_size`` (planning/groups.py), and each
    member's share of the vector as a slot reducer; None (a flat round) if some group would
    have nobody that may reduce. The ``last`` round's groups carry over to those who stayed.
    An auxiliary member that reduces no slot has nothing to do: it is in no group, and its
    share is 0 (the caller leaves it out of the round, ``idle``)."""
    links = link_claims(members, group, optional, auxiliary, sends_only)
    index = {p: i for i, p in enumerate(group)}
    kept = None
    if last is not None:  # (as members of this round: those who left dropped)
        kept = ([[index[p] for p in g if p in index] for g in last.groups],
                [[index[p] for p in r if p in index] for r in last.reducers])
    try:
        plan = plan_groups(links, group_size, 1.0, kept)
    except (ArithmeticError, ValueError) as exc:
        log.warning("grouped round: %s; a flat round instead", exc)
        return None
    share = dict.fromkeys(group, 0.0)
    for reducers in plan.reducers:
        for k, i in enumerate(reducers):
            share[group[i]] = plan.slot_shares[k]
    reducing = {i for r in plan.reducers for i in r}
    idle = {i for i, p in enumerate(group) if p in auxiliary and i not in reducing}
    try:
        groups = RoundGroups(groups=[[group[i] for i in g if i not in idle] for g in plan.groups],
                             reducers=[[group[i] for i in r] for r in plan.reducers],
                             slot_shares=plan.slot_shares, pieces=plan.pieces)
    except ValueError as exc:
        log.warning("grouped round: %s; a flat round instead", exc)
        return None
    return groups, Balance([share[p] for p in group], plan.seconds)
