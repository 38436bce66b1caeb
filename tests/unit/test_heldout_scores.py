"""The learning curve's held-out metric: a score counts for a settled state only, once per
member, and the curve shows the median, so one stranger's number moves nothing once others
scored the same state."""

from engine.backbone.tracker.heldout import KEPT_EPOCHS, HeldOutScores
from engine.wire.control import Evaluated

STATE = "a" * 64


def score(loss: float, accuracy: float | None = None, epoch: int = 10, state: str = STATE) -> Evaluated:
    return Evaluated(epoch=epoch, state_sha256=state, loss=loss, samples=100, accuracy=accuracy)


def test_a_score_of_a_state_the_collaboration_never_held_is_ignored():
    scores = HeldOutScores()
    scores.holding(10, STATE)
    assert scores.scored("liar", score(0.0, state="b" * 64)) is None
    assert scores.scored("liar", score(0.0, epoch=11)) is None
    recorded = scores.scored("honest", score(2.5, 0.9))
    assert recorded is not None and (recorded.epoch, recorded.loss, recorded.accuracy) == (10, 2.5, 0.9)


def test_the_median_leaves_out_one_liar_among_three_and_each_member_scores_once():
    scores = HeldOutScores()
    scores.holding(10, STATE)
    scores.scored("a", score(2.5, 0.90))
    scores.scored("b", score(2.6, 0.91))
    recorded = scores.scored("liar", score(0.0, 1.0))
    assert recorded is not None and recorded.loss == 2.5 and recorded.accuracy == 0.91
    assert scores.scored("liar", score(0.0, 1.0)) is None  # a second score from it counts for nothing


def test_old_states_are_forgotten_and_a_rewound_epoch_starts_over():
    scores = HeldOutScores()
    for epoch in range(KEPT_EPOCHS + 5):
        scores.holding(epoch, f"{epoch:064x}")
    assert scores.scored("late", score(1.0, epoch=0, state=f"{0:064x}")) is None
    last = KEPT_EPOCHS + 4
    scores.scored("a", score(3.0, epoch=last, state=f"{last:064x}"))
    scores.holding(last, "c" * 64)  # the collaboration rewound and stepped to this epoch again
    recorded = scores.scored("b", score(2.0, epoch=last, state="c" * 64))
    assert recorded is not None and recorded.loss == 2.0 and recorded.scores == 1
