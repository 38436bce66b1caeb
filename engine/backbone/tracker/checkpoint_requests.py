"""The checkpoints the backbone asked peers to upload, and which of those it still waits for.

A request lives while its upload may still come: until the file is stored, the upload fails,
the peer leaves, or its patience passes: ``START_PATIENCE`` for an upload to begin, and
``UPLOAD_PATIENCE`` for one under way (a slow upload may still land after that; it is only
no longer what the next request waits on). A peer that never uploads ranks last for the
chore only until its request lapses. The next checkpoint is due from the newest epoch still
on its way, not from the last one stored: a 270-MB state takes minutes on a home uplink,
and asking again every round meanwhile would start second uploads of the same chore.

A peer owes one checkpoint at a time, of the epoch it was asked for or any later one: its
snapshot is of the state it holds when it takes it, and where rounds outrun that (tenths
of a second apart) it is a step on. Refusing it left the chore owed for its whole patience:
that epoch had no checkpoint, and the next came an interval after it.

Who is asked ranks by what the backbone saw: a peer's last stored upload, timed from its
first byte to its file stored, speaks for its uplink; its claimed uplink counts only until
then (a claim buys one chore: kept, it is replaced by the rate seen; broken, it is a failure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A peer asked in a RoundStart uploads once the round settles and its state is encoded:
# seconds, or a minute for a large state on a slow disk.
START_PATIENCE = 300.0
UPLOAD_PATIENCE = 3600.0  # a 2-GB state over 5 Mbit/s


@dataclass
class _Request:
    epoch: int  # the epoch asked for: an upload of it or of a later one answers
    since: float  # asked, or its upload began
    started: bool = False

    def lapsed(self, now: float) -> bool:
        return now - self.since >= (UPLOAD_PATIENCE if self.started else START_PATIENCE)


class CheckpointRequests:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._requests: dict[str, _Request] = {}  # by peer
        # Per peer, requests that failed or lapsed since its last stored upload: it ranks
        # behind peers with fewer for the next chore (else a peer claiming the fastest
        # uplink that fails every upload at once would be asked every round, and nobody
        # else ever).
        self._failures: dict[str, int] = {}
        self._delivered: dict[str, float] = {}  # bytes per second of its last stored upload

    def ask(self, peer_id: str, epoch: int) -> None:
        """(A newer chore replaces one the peer still owes: either checkpoint would do.)"""
        self._requests[peer_id] = _Request(epoch, self._clock())

    def expects(self, peer_id: str, epoch: int) -> bool:
        self._expire()
        request = self._requests.get(peer_id)
        return request is not None and epoch >= request.epoch

    def started(self, peer_id: str, epoch: int) -> bool:
        """An upload of an asked-for checkpoint began; False if one already runs (one at a
        time: a second would restart the patience, and its failure end the first)."""
        request = self._requests.get(peer_id)
        if request is None or request.started or epoch < request.epoch:
            return False
        request.started, request.since = True, self._clock()
        return True

    def ended(self, peer_id: str, epoch: int, stored: bool, size: int = 0) -> None:
        """Its upload of ``epoch`` ended: a failed one is not waited for any more, and counts
        against its peer; a stored one (of ``size`` bytes) clears the peer's record and times
        its uplink."""
        request = self._requests.get(peer_id)
        if request is not None and epoch < request.epoch:
            request = None  # (an older upload: the chore it owes now is still to come)
        else:
            self._requests.pop(peer_id, None)
        if stored:  # (even past its patience: it delivered)
            self._failures.pop(peer_id, None)
            if request is not None and request.started and size > 0:
                self._delivered[peer_id] = size / max(self._clock() - request.since, 1e-3)
        elif request is not None:
            self._failures[peer_id] = self._failures.get(peer_id, 0) + 1

    def left(self, peer_id: str) -> None:
        self._requests.pop(peer_id, None)
        self._failures.pop(peer_id, None)
        self._delivered.pop(peer_id, None)

    def rank(self, peer_id: str, claimed: float | None) -> tuple[bool, int, float]:
        """Its place for the next chore, lowest first: not owing an upload, fewest failed,
        then fastest, by the rate its last stored upload showed, or else by its claim."""
        speed = self._delivered.get(peer_id, claimed or 0.0)
        return peer_id in self.uploading(), self.failures(peer_id), -speed

    def uploading(self) -> set[str]:
        """Peers that owe an upload: asked, and not given up on."""
        self._expire()
        return set(self._requests)

    def failures(self, peer_id: str) -> int:
        return self._failures.get(peer_id, 0)

    def newest_epoch(self) -> int | None:
        """The newest epoch whose checkpoint is still on its way (None: none is)."""
        self._expire()
        return max((r.epoch for r in self._requests.values()), default=None)

    def _expire(self) -> None:
        now = self._clock()
        for peer_id, request in [(p, r) for p, r in self._requests.items() if r.lapsed(now)]:
            self.ended(peer_id, request.epoch, stored=False)
