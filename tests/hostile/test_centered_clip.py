"""CenteredClip against gradient noise that passes a reducer's checks: a project that asks
for it keeps a stranger's pull on the average to the honest peers' own spread. (Its own
module: a collaboration of its own, never running beside another on the same cores.)"""

import pytest

from engine.project import AggregationSpec
from tests.hostile.collaboration import hostile_project, running
from tests.hostile.poisoner import noise, poisoned

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def clipped(tmp_path_factory):
    project = hostile_project(aggregation=AggregationSpec(method="centered_clip"))
    with running(tmp_path_factory.mktemp("centered-clip"), project=project) as collaboration:
        yield collaboration


async def test_centered_clip_keeps_noise_that_passes_the_checks_from_moving_the_model(clipped, report_figure):
    """Noise five times an honest gradient's length passes the norm check, so its sender
    counts as a member that computed (and is credited as one); CenteredClip keeps the
    loss on its course."""
    sent, refused = await poisoned(clipped, noise(5.0), report_figure, "noise 5x, centered_clip",
                                   may_earn=True)
    # Most of it passed the checks: what kept the loss on course is CenteredClip.
    assert refused * 10 < sent, (sent, refused)
