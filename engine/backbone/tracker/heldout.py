"""The learning curve's held-out metric. The trainers a step chose (engine/evaluators.py)
score the held-out set on the state it settled on; a score counts only from one of them,
for that state, once, and the curve shows the median once all of them scored: a stranger
cannot choose itself, and its one number among three moves nothing."""

from __future__ import annotations

import statistics
from collections import OrderedDict

from engine.backbone.tracker.outputs import RecordHeldOut
from engine.wire.control import Evaluated

KEPT_EPOCHS = 16  # settled states a late score may still name


class HeldOutScores:
    def __init__(self) -> None:
        self._chosen: OrderedDict[int, tuple[str, list[str]]] = OrderedDict()  # epoch -> (state, evaluators)
        self._scores: dict[int, dict[str, Evaluated]] = {}

    def settled(self, epoch: int, state_sha256: str, chosen: list[str]) -> None:
        """The collaboration settled on this state (a rewound epoch's earlier one is another)."""
        if not chosen:
            return
        self._chosen[epoch] = (state_sha256, chosen)
        self._chosen.move_to_end(epoch)
        self._scores.pop(epoch, None)
        while len(self._chosen) > KEPT_EPOCHS:
            old, _ = self._chosen.popitem(last=False)
            self._scores.pop(old, None)

    def scored(self, peer_id: str, msg: Evaluated) -> RecordHeldOut | None:
        state, chosen = self._chosen.get(msg.epoch, ("", []))
        if state != msg.state_sha256 or peer_id not in chosen or msg.samples == 0:
            return None
        scores = self._scores.setdefault(msg.epoch, {})
        if peer_id in scores:
            return None
        scores[peer_id] = msg
        if len(scores) < len(chosen):
            return None
        accuracies = [s.accuracy for s in scores.values() if s.accuracy is not None]
        return RecordHeldOut(msg.epoch, statistics.median(s.loss for s in scores.values()),
                             statistics.median(accuracies) if accuracies else None, len(scores))
