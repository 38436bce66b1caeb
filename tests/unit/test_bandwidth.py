"""The peer's link estimate: probed, raised by fast rounds, never lowered by slow ones, capped."""

from engine.peer.bandwidth import MIN_ROUND_BYTES, REPROBE_EVERY, Bandwidth, LinkEstimate


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_unmeasured_until_probed_then_probed_again_after_a_while():
    clock = Clock()
    link = Bandwidth(clock)
    assert link.estimate() == LinkEstimate(None, None) and link.probe_due()
    link.probed(1e6, 4e6)
    assert link.estimate() == LinkEstimate(1e6, 4e6) and not link.probe_due()
    clock.now += REPROBE_EVERY
    assert link.probe_due()


def test_a_round_faster_than_the_estimate_raises_it_and_a_slower_one_does_not_lower_it():
    link = Bandwidth(Clock())
    link.probed(1e6, 1e6)
    link.observed(sent=4 * 10**6, received=10**6, seconds=2.0)  # 2 MB/s up, 0.5 MB/s down
    raised = link.estimate()
    assert 1e6 < raised.upload < 2e6  # partway: one round is one sample
    assert raised.download == 1e6  # the round waited on someone else: not a measure of our link
    link.observed(sent=MIN_ROUND_BYTES // 2, received=0, seconds=1e-4)  # too small to say anything
    assert link.estimate() == raised


def test_the_users_caps_bound_what_is_reported():
    link = Bandwidth(Clock())
    assert link.estimate(max_upload=5e5) == LinkEstimate(5e5, None)
    link.probed(1e6, 4e6)
    assert link.estimate(max_upload=5e5, max_download=1e7) == LinkEstimate(5e5, 4e6)
