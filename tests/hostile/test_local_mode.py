"""Local mode (DiLoCo) against a poisoner: pseudo-gradients travel as gradient sums do, so
the reducers' checks and CenteredClip stand between a hostile member and the outer step.
Three honest `cotrain peer` processes with their own fixed data train to outer step N with
a stranger sending poisoned parts, against the same three alone; the loss is that of the
checkpoint of step N on held-out batches.

The loss at step N is a loose measure here: an outer step carries the samples that arrive
until its round ends, and rounds with a stranger in them last longer, so the attacked runs
took more samples to step N (CI measured 6-17% lower losses), and honest runs alone
spread over 7%. What the test leans on as well: honest reducers left the poisoned parts
out, and the poisoner earned nothing for them."""

from __future__ import annotations

import asyncio

import pytest

from engine.project import AggregationSpec, LocalSpec, ProjectSpec
from tests.collab.harness import TINY
from tests.hostile.collaboration import hostile_project
from tests.hostile.poisoner import SAMPLES
from tests.hostile.test_final_loss import SCALED, run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OUTER_STEPS = 15
# Honest runs alone spread over 7% at outer step 15 (held-out 2.88-3.08 in six runs, one CI):
# how many samples each outer step takes depends on timing. Sync mode's 60 epochs hold 5%.
MARGIN = 0.10


def project(method: str = "centered_clip") -> ProjectSpec:
    # Four inner steps of 16 samples (one micro-batch) per peer between outer steps.
    return hostile_project(mode="local", target_batch_size=3 * 4 * 16, checkpoint_every=OUTER_STEPS,
                           local=LocalSpec(inner_batch_size=16), task_params=dict(TINY, micro_batch=16),
                           aggregation=AggregationSpec(method=method, verify_probability=0.5))


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> float:
    return asyncio.run(run(tmp_path_factory.mktemp("honest-local"), project())).loss


@pytest.mark.parametrize("attack, method", [
    ("NaN parts", "centered_clip"), ("parts x(-1e4)", "centered_clip"), (SCALED, "centered_clip"),
    (SCALED, "mean")])
async def test_a_poisoner_moves_the_outer_steps_less_than_five_percent(tmp_path, baseline, report_figure,
                                                                       attack, method):
    """(``mean`` as demo-lm-home aggregates: against the same honest peers under
    ``centered_clip``, which averages honest inputs to within 0.3% of their mean.)"""
    attacked = await run(tmp_path, project(method), attack)
    report_figure(f"local mode, {attack}, {method}, outer step {OUTER_STEPS}: held-out loss "
                  f"{attacked.loss:.4f} ({attacked.loss / baseline - 1:+.1%} against three honest peers "
                  f"alone: {baseline:.4f})")
    report_figure(f"local mode, {attack}: {attacked.poisoned} poisoned parts sent, {attacked.left_out} "
                  f"left out by honest reducers, {attacked.credited} samples credited to the poisoner "
                  f"(its {attacked.harmless} rounds of honest-looking parts claimed {SAMPLES} each)")
    # Only the honest-looking parts it sent before it knew the scale to poison with earn.
    assert attacked.left_out > 0, "no poisoned part was left out"
    assert attacked.credited <= attacked.harmless * SAMPLES, (attacked.credited, attacked.harmless)
    assert attacked.loss <= baseline * (1 + MARGIN), (attacked.loss, baseline)
