"""The plan of a grouped round: which members form each group, which member of each group
reduces which slot of the vector, and how large each slot and each cross-group piece is.

A round of N members in m groups is an exact two-level all-reduce:

1. in each group, slot k of every sender's vector goes to the group's reducer of slot k;
2. the reducers of slot k across the groups all-reduce their groups' partial sums: each
   finishes one piece of the slot, for all of them;
3. each reducer sends the finished slot back to its group.

Every piece is finished by one member, so every member applies the same bits, as in a
flat round. A member links to its group and, as a reducer, to the m - 1 reducers of its
slot: about G + m links (G the group size), where a flat round needs N - 1.

Sizes come from a linear program, as the flat round's do (load_balancing.py). With a unit
vector, slot k's share s_k and u_kg the piece group g's reducer finishes (s_k times the
piece's fraction of the slot: the substitution keeps the program linear), the reducer of
slot k in group g moves, each way,

    a + s_k * (|S_g| - 2a + 1) + u_kg * (m - 2)

(its own other slots out and back; its group's senders' parts of slot k in and the results
out; its partial sum's other pieces out and back, and the other groups' pieces of its own
in and the finished piece out), and a member that reduces nothing moves a. The round lasts
the most loaded member's load over its link, as in the flat model; hops add latency that
model leaves out (four per round against two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.planning.load_balancing import Member, solve_lp

# Members keep last round's groups (and so their links, each a NAT traversal to set up)
# unless new groups would end the round in this share of the time or less.
REGROUP_GAIN = 0.8


@dataclass(frozen=True)
class GroupedPlan:
    groups: list[list[int]]  # member indices, per group
    reducers: list[list[int]]  # per group, its reducer of each slot (slot k: the k-th)
    slot_shares: list[float]  # per slot, its share of the vector (summing to 1)
    pieces: list[list[float]]  # per slot, per group: the fraction of the slot its reducer finishes
    seconds: float  # the round's predicted transfer time

    @property
    def slots(self) -> int:
        return len(self.slot_shares)

    def links(self) -> list[int]:
        """Per member, how many others it exchanges with in the round."""
        count = [0] * sum(len(g) for g in self.groups)
        for group, reducers in zip(self.groups, self.reducers, strict=True):
            for i in group:
                count[i] = len(group) - 1 + (len(self.groups) - 1) * (i in reducers)
        return count


def form_groups(members: Sequence[Member], group_size: int) -> list[list[int]]:
    """Members dealt into ceil(N / group_size) groups of near-equal size and strength: by
    link, fastest first and those that may reduce before those that may not, in a snake
    (1, 2, .., m, m, .., 1): each group gets as many reducers, and of every speed."""
    if group_size < 2:
        raise ValueError(f"a group has at least 2 members, not {group_size}")
    count = math.ceil(len(members) / group_size)
    order = sorted(range(len(members)), key=lambda i: (not members[i].reduces, -_capacity(members[i]), i))
    groups: list[list[int]] = [[] for _ in range(count)]
    for rank, i in enumerate(order):
        lap, at = divmod(rank, count)
        groups[at if lap % 2 == 0 else count - 1 - at].append(i)
    return groups


def plan_groups(members: Sequence[Member], group_size: int, nbytes: float,
                kept: tuple[list[list[int]], list[list[int]]] | None = None,
                regroup_gain: float = REGROUP_GAIN) -> GroupedPlan:
    """The grouped round that ends soonest; ValueError if a group has nobody who may reduce.
    ``kept``: the last round's groups and slot reducers, as indices of these members (those
    who left dropped). Their links are open, so they carry over (``carried_groups``: the
    members who stayed keep their groups and slots, newcomers fill the smallest groups)
    unless new groups would end the round in ``regroup_gain`` of the time or less."""
    fresh = _planned(members, form_groups(members, group_size), nbytes)
    groups = carried_groups(members, group_size, kept[0]) if kept is not None else None
    if kept is None or groups is None:
        return fresh
    again = _planned(members, groups, nbytes, [r for g in kept[1] for r in g])
    return fresh if fresh.seconds < regroup_gain * again.seconds else again


def carried_groups(members: Sequence[Member], group_size: int,
                   last: list[list[int]]) -> list[list[int]] | None:
    """Last round's groups for these members: those who stayed keep theirs; a group left
    with fewer than half of ``group_size`` is dealt out; newcomers and its members join the
    smallest groups, fastest first; a group grown past one and a half times ``group_size``
    splits in two. None if fewer than two groups are left, or one has nobody who may reduce."""
    floor, ceiling = max(2, group_size // 2), max(3, group_size * 3 // 2)
    stayed = [[i for i in g if 0 <= i < len(members)] for g in last]
    groups = [g for g in stayed if len(g) >= floor]
    if not groups:
        return None
    placed = {i for g in groups for i in g}
    loose = sorted((i for i in range(len(members)) if i not in placed),
                   key=lambda i: (not members[i].reduces, -_capacity(members[i]), i))
    for i in loose:
        smallest = min(groups, key=len)
        smallest.append(i)
        if len(smallest) > ceiling:
            groups.remove(smallest)
            groups += [smallest[0::2], smallest[1::2]]
    if len(groups) < 2 or any(not any(members[i].reduces for i in g) for g in groups):
        return None  # (one group is a flat round, planned as such)
    return groups


def _planned(members: Sequence[Member], groups: list[list[int]], nbytes: float,
             first: Sequence[int] = ()) -> GroupedPlan:
    """The plan for these groups: each takes as many slot reducers as the group with fewest
    has members that may reduce. ``first``: reducers that keep their slots if they can."""
    slots = min(sum(members[i].reduces for i in g) for g in groups)
    if slots == 0:
        raise ValueError("a group has no member that may reduce")
    # Each group's fastest reducers take the slots, in order: slot k pairs the k-th fastest
    # of every group across groups, so no slot waits on one slow reducer among fast ones.
    # Reducers of the last round come first, in their slots: their links are open.
    order = {i: k for k, i in enumerate(first)}
    reducers = [sorted((i for i in g if members[i].reduces),
                       key=lambda i: (order.get(i, len(order)), -_capacity(members[i])))[:slots]
                for g in groups]
    shares, pieces = _solve(members, groups, reducers, slots)
    plan = GroupedPlan(groups, reducers, shares, pieces, 0.0)
    return GroupedPlan(groups, reducers, shares, pieces, grouped_round_time(plan, members, nbytes))


def grouped_loads(plan: GroupedPlan, members: Sequence[Member], nbytes: float) -> list[float]:
    """Bytes each member moves each way in the round."""
    m = len(plan.groups)
    out = [nbytes * members[i].sends for i in range(len(members))]
    for g, (group, reducers) in enumerate(zip(plan.groups, plan.reducers, strict=True)):
        senders = sum(members[i].sends for i in group)
        for k, i in enumerate(reducers):
            a, s, u = members[i].sends, plan.slot_shares[k], plan.slot_shares[k] * plan.pieces[k][g]
            out[i] = nbytes * (a + s * (senders - 2 * a + 1) + u * (m - 2))
    return out


def grouped_round_time(plan: GroupedPlan, members: Sequence[Member], nbytes: float) -> float:
    loads = grouped_loads(plan, members, nbytes)
    return max(load / _capacity(m) for load, m in zip(loads, members, strict=True))


def _solve(members: Sequence[Member], groups: list[list[int]], reducers: list[list[int]],
           slots: int) -> tuple[list[float], list[list[float]]]:
    """(slot shares, pieces) minimising the most loaded member's time: variables s_k, then
    u_kg (slot-major), then T."""
    m, n = len(groups), slots + slots * len(groups) + 1
    scale = max(_capacity(x) for x in members)
    rows, bounds_ub = [], []
    for g, (group, mine) in enumerate(zip(groups, reducers, strict=True)):
        senders = sum(members[i].sends for i in group)
        for i in group:
            a, row = float(members[i].sends), np.zeros(n)
            if i in mine:
                k = mine.index(i)
                row[k] = senders - 2 * a + 1
                row[slots + k * m + g] = m - 2
            row[-1] = -_capacity(members[i]) / scale
            rows.append(row)
            bounds_ub.append(-a)
    equal = np.zeros((1 + slots, n))
    equal[0, :slots] = 1.0  # the slots make the vector
    for k in range(slots):  # and each slot's pieces the slot
        equal[1 + k, k] = -1.0
        equal[1 + k, slots + k * m: slots + (k + 1) * m] = 1.0
    x = solve_lp(np.eye(n)[-1], np.array(rows), np.array(bounds_ub), equal,
                 np.concatenate([[1.0], np.zeros(slots)]), [(0.0, None)] * n)
    shares = [max(float(s), 0.0) for s in x[:slots]]
    pieces = []
    for k in range(slots):
        u = [max(float(v), 0.0) for v in x[slots + k * m: slots + (k + 1) * m]]
        total = sum(u)
        pieces.append([v / total for v in u] if total > 0 else [1.0 / m] * m)
    total = sum(shares)
    return [s / total for s in shares], pieces


def _capacity(member: Member) -> float:
    return min(member.upload, member.download)
