"""Pairs of peers that failed to exchange, kept apart with a growing pause, and the largest
group of peers that can all reach each other."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)
MAX_PAIR_COOLDOWN = 600.0  # lets one freak measurement fade over a few hundred reports


class Pairs:
    def __init__(self, project: str, clock: Callable[[], float], cooldown: float = 30.0) -> None:
        self.project = project
        self.cooldown = cooldown
        self._clock = clock
        self._apart_until: dict[frozenset[str], float] = {}
        self._strikes: dict[frozenset[str], int] = {}  # failed exchanges in a row, for backoff

    def reachable(self, a: str, b: str, now: float) -> bool:
        return self._apart_until.get(frozenset((a, b)), 0.0) <= now

    def failed_lately(self, a: str, b: str) -> bool:
        """Whether their last exchange failed (its cooldown may be over, but nothing proved
        the path works again)."""
        return bool(self._strikes.get(frozenset((a, b))))

    def keep_apart(self, a: str, b: str) -> None:
        """Back off a pair that failed to exchange: each retry that fails again doubles the
        wait (up to ``MAX_PAIR_COOLDOWN``), so a dead relay costs a round timeout now and
        then rather than every half minute."""
        pair = frozenset((a, b))
        if pair in self._apart_until and self._apart_until[pair] > self._clock():
            return  # both ends report the same failure
        strikes = self._strikes.get(pair, 0) + 1
        self._strikes[pair] = strikes
        cooldown = min(self.cooldown * 2 ** (strikes - 1), MAX_PAIR_COOLDOWN)
        self._apart_until[pair] = self._clock() + cooldown
        log.info("%s: keeping %s apart for %.0fs", self.project, " and ".join(sorted(pair)), cooldown)

    def exchanged(self, group: Iterable[str]) -> None:
        """They all exchanged fine: a later failure between any two starts afresh."""
        members = set(group)
        for pair in [pair for pair in self._strikes if pair <= members]:
            del self._strikes[pair]

    def connected_group(self, candidates: list[tuple[str, int]], now: float) -> list[str]:
        """The largest set of ``(peer, samples)`` that can all reach each other. Greedily, the
        peers that reach the most others first (then the most samples), so one cut-off peer
        never outranks a connected majority. Linear in peers plus pairs kept apart (few), not
        quadratic: a thousand peers open a round without stalling the backbone."""
        self._apart_until = {pair: t for pair, t in self._apart_until.items() if t > now}
        apart: dict[str, set[str]] = {peer: set() for peer, _ in candidates}
        for pair in self._apart_until:
            a, b = tuple(pair)
            if a in apart and b in apart:
                apart[a].add(b)
                apart[b].add(a)
        group: list[str] = []
        chosen: set[str] = set()
        for peer, _ in sorted(candidates, key=lambda c: (len(apart[c[0]]), -c[1], c[0])):
            if not apart[peer] & chosen:
                group.append(peer)
                chosen.add(peer)
        return sorted(group)
