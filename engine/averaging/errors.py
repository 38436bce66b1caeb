"""How a round fails on a peer, and whom it blames."""

from __future__ import annotations

from collections.abc import Iterable

from engine.wire import ProtocolError


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
