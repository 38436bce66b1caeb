"""Attacks with gradient values, by a stranger that takes part in rounds, against a backbone
and three honest peers started as users start them (the stranger: tests/hostile/poisoner.py).
Before: a NaN part turned every honest peer's parameters into NaN for good, a part x(-1e4)
raised the demo's loss from 5.25 to 6.25 while every hash agreed, and a claim of 10^12
samples divided everyone else's gradient away."""

import pytest

from tests.hostile.attack_effect import PAIR_RATE_FLOOR
from tests.hostile.collaboration import running
from tests.hostile.poisoner import flipped, inflated, nan, noise, poisoned

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def collab(tmp_path_factory):
    with running(tmp_path_factory.mktemp("gradients")) as collaboration:
        yield collaboration


@pytest.mark.parametrize("name, poison", [("NaN parts", nan), ("parts x(-1e4)", flipped),
                                          ("noise 100x an honest gradient's length", noise(100.0)),
                                          ("10^12 samples claimed", inflated)])
async def test_poisoned_parts_are_left_out_and_cost_only_their_sender(collab, report_figure, name, poison):
    _, refused = await poisoned(collab, poison, report_figure, name)
    assert refused >= 1, "no honest reducer left the poisoned part out"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with running(tmp_path_factory.mktemp("gradients-pair"), peers=1) as collaboration:
        yield collaboration


@pytest.mark.parametrize("name, poison", [("alone with one member: parts x(-1e4)", flipped),
                                          ("alone with one member: noise 100x", noise(100.0))])
async def test_alone_with_one_member_a_poisoner_is_judged_by_the_reducers_own_part(pair, report_figure,
                                                                                   name, poison):
    """Two parts make no majority (as when the others are still starting, which is how a
    poisoner once ruined a local-mode run in CI): the honest reducer's own part judges the
    stranger's, and sets it aside."""
    _, refused = await poisoned(pair, poison, report_figure, name, rate_floor=PAIR_RATE_FLOOR)
    assert refused >= 1, "the honest reducer took the poisoned part in"
