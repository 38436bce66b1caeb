"""The learning curve's held-out metric. Peers score the held-out set on the state they hold;
a score counts only for a state the collaboration settled on, one per member and epoch, and
the curve shows the median of them, so that one stranger's number moves nothing once
others have scored the same state."""

from __future__ import annotations

import statistics
from collections import OrderedDict

from engine.backbone.tracker.outputs import RecordHeldOut
from engine.wire.control import Evaluated

KEPT_EPOCHS = 16  # settled states a late score may still name
MAX_SCORES = 16  # members' scores counted per epoch


class HeldOutScores:
    def __init__(self) -> None:
        self._settled: OrderedDict[int, str] = OrderedDict()
        self._scores: dict[int, dict[str, Evaluated]] = {}

    def holding(self, epoch: int, state_sha256: str | None) -> None:
        """The collaboration holds this state now."""
        if state_sha256 is None or self._settled.get(epoch) == state_sha256:
            return
        self._settled[epoch] = state_sha256
        self._scores.pop(epoch, None)  # a rewound epoch's earlier state is another state
        while len(self._settled) > KEPT_EPOCHS:
            old, _ = self._settled.popitem(last=False)
            self._scores.pop(old, None)

    def scored(self, peer_id: str, msg: Evaluated) -> RecordHeldOut | None:
        if self._settled.get(msg.epoch) != msg.state_sha256 or msg.samples == 0:
            return None
        scores = self._scores.setdefault(msg.epoch, {})
        if peer_id in scores or len(scores) >= MAX_SCORES:
            return None
        scores[peer_id] = msg
        accuracies = [s.accuracy for s in scores.values() if s.accuracy is not None]
        return RecordHeldOut(msg.epoch, statistics.median(s.loss for s in scores.values()),
                             statistics.median(accuracies) if accuracies else None, len(scores))
