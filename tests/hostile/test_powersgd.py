"""A reducer that lies in one phase of PowerSGD rounds: each part of each phase is drawn
for a check on its own, so a lie in phase P (which only turns the subspace the step lies
in) or in phase Q (which moves the step within it) is caught as often as an uncompressed
one, the round discarded and the liar expelled. A real liar process among three honest
peers, under ``mean``, where only the checks stand in its way."""

from __future__ import annotations

import pytest

from engine.project import AggregationSpec
from tests.hostile.collaboration import hostile_project
from tests.hostile.test_final_loss import CAUGHT_WITHIN, EPOCHS, PROBABILITY, run
from tests.hostile.wrong_reducer import LIE_PHASE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PHASES = {0: "phase P", 1: "phase Q"}


@pytest.mark.parametrize("phase", PHASES, ids=PHASES.values())
async def test_a_reducer_lying_in_one_powersgd_phase_is_caught_there_and_expelled(
        tmp_path, monkeypatch, report_figure, phase):
    monkeypatch.setenv(LIE_PHASE, str(phase))  # (the liar process inherits it)
    spec = hostile_project(checkpoint_every=EPOCHS, compression="powersgd", aggregation=AggregationSpec(
        method="mean", verify_probability=PROBABILITY))
    attacked = await run(tmp_path, spec, "a wrong reducer")
    collab = attacked.collab
    liar_log = next(p for p in collab.peers if p.name == "liar").log.read_text(errors="replace")
    phases = {int(line.rsplit("phase ", 1)[1].split()[0]) for line in liar_log.splitlines()
              if "lied in round" in line}
    caught = [line for line in collab.backbone.log.read_text(errors="replace").splitlines()
              if "is wrong" in line and "expelling it" in line]
    discarded = {int(line.split("round ")[1].split(":")[0]) for line in caught}
    parts = {int(line.split(" for part ")[1].split()[0]) for line in caught}
    kept = {e["round_id"] for p in collab.peers if p.name != "liar" for e in p.epochs}
    hashes = [set(collab.hashes(epoch).values()) for epoch in range(1, EPOCHS + 1)]
    report_figure(f"PowerSGD rank 4, mean, a reducer lying in {PHASES[phase]}, checks at "
                  f"p={PROBABILITY}: lied in {len(attacked.lies)} rounds, caught {len(caught)} time(s) "
                  f"at part(s) {sorted(parts)} and expelled, {len(set(attacked.lies) & kept)} unchecked "
                  f"wrong steps kept; held-out loss {attacked.loss:.4f}")
    assert phases == {phase}
    assert len(caught) == 1 and len(attacked.lies) <= CAUGHT_WITHIN
    assert attacked.lies[-1] in discarded  # its last lie was the one caught: expelled, it reduced no more
    assert not discarded & kept, "an honest peer kept the step of a round found wrong"
    assert all(len(h) <= 1 for h in hashes), "members held different states after a step"
