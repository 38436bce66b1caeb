"""The learning curve's held-out metric: only the trainers a step chose score it, for the
state it settled on, once each, and the curve shows their median once all have scored -- a
stranger cannot choose itself, and one number among three moves nothing."""

from engine.backbone.tracker.heldout import KEPT_EPOCHS, HeldOutScores
from engine.evaluators import EVALUATORS, evaluators
from engine.wire.control import Evaluated

STATE = "a" * 64


def score(loss: float, accuracy: float | None = None, epoch: int = 10, state: str = STATE) -> Evaluated:
    return Evaluated(epoch=epoch, state_sha256=state, loss=loss, samples=100, accuracy=accuracy)


def test_the_same_three_are_chosen_by_everyone_and_only_every_few_steps():
    trainers = [f"{i:016x}" for i in range(40)]
    picked = evaluators(trainers, 10, every=10)
    assert len(picked) == EVALUATORS and picked == evaluators(list(reversed(trainers)), 10, every=10)
    assert evaluators(trainers, 11, every=10) == []
    assert set(evaluators(trainers[:2], 20, every=10)) == set(trainers[:2])  # a small round: all


def test_only_the_chosen_are_heard_and_only_about_the_settled_state():
    scores = HeldOutScores()
    scores.settled(10, STATE, ["a", "b", "c"])
    assert scores.scored("outsider", score(0.0, 1.0)) is None
    assert scores.scored("a", score(0.0, state="b" * 64)) is None  # a state never settled on
    assert scores.scored("a", score(0.0, epoch=11)) is None
    assert scores.scored("a", score(2.5, 0.90)) is None  # shown once all three have scored
    assert scores.scored("b", score(2.6, 0.91)) is None


def test_the_median_leaves_out_one_liar_among_three_and_each_scores_once():
    scores = HeldOutScores()
    scores.settled(10, STATE, ["a", "b", "liar"])
    scores.scored("liar", score(0.0, 1.0))
    assert scores.scored("liar", score(0.0, 1.0)) is None
    scores.scored("a", score(2.5, 0.90))
    recorded = scores.scored("b", score(2.6, 0.91))
    assert recorded is not None and (recorded.loss, recorded.accuracy, recorded.scores) == (2.5, 0.91, 3)


def test_old_states_are_forgotten_and_a_rewound_epoch_starts_over():
    scores = HeldOutScores()
    for epoch in range(KEPT_EPOCHS + 5):
        scores.settled(epoch, f"{epoch:064x}", ["a"])
    assert scores.scored("a", score(1.0, epoch=0, state=f"{0:064x}")) is None
    last = KEPT_EPOCHS + 4
    scores.settled(last, "c" * 64, ["a"])  # the collaboration rewound and stepped to this epoch again
    recorded = scores.scored("a", score(2.0, epoch=last, state="c" * 64))
    assert recorded is not None and recorded.loss == 2.0 and recorded.scores == 1
