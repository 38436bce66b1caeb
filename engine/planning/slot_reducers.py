"""Who reduces each slot of a grouped round as the round goes, and what a slot reducer's
level-2 parts count for: rules the peers (engine/averaging/grouped.py) and the backbone's
checks (engine/backbone/tracker/grouped_parts.py) must read alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def slot_reducers_now(groups: Sequence[Sequence[str]], reducers: Sequence[Sequence[str]],
                      group: Sequence[str], now: Sequence[str] | None) -> list[list[str]]:
    """Each group's reducer of each slot now. ``now`` is the backbone's word (Reassign): per
    member of the round, who reduces that member's share now -- a lost slot reducer's
    share goes to a backup of its own group, which so takes its slot at both levels. A
    word that does not fit the round, or a backup outside the slot's group, changes nothing
    (the round then fails as the lost reducer's would)."""
    if now is None or len(now) != len(group):
        return [list(r) for r in reducers]
    at = dict(zip(group, now, strict=True))
    return [[at.get(r, r) if at.get(r, r) in members else r for r in slot_reducers]
            for members, slot_reducers in zip(groups, reducers, strict=True)]


def level_two_caps(groups: Sequence[Sequence[str]], reducers: Sequence[Sequence[str]],
                   caps: Mapping[str, int]) -> dict[str, int]:
    """What a slot reducer's level-2 parts count for at most: its group's caps (a share of
    the target batch bounds one sender, not a group's sum)."""
    out: dict[str, int] = {}
    for members, slot_reducers in zip(groups, reducers, strict=True):
        total = sum(caps.get(p, 0) for p in members)
        out.update(dict.fromkeys(slot_reducers, total))
    return out


def exchanges_with(groups: Sequence[Sequence[str]], reducers: Sequence[Sequence[str]], me: str) -> set[str]:
    """Whom ``me`` exchanges with in a grouped round: its group, and as a reducer of slot k,
    the reducers of slot k in the other groups (each of them exchanges with ``me`` too)."""
    out: set[str] = set()
    for members, slot_reducers in zip(groups, reducers, strict=True):
        if me in members:
            out.update(members)
            for k in (k for k, r in enumerate(slot_reducers) if r == me):
                out.update(other[k] for other in reducers if k < len(other))
    out.discard(me)
    return out
