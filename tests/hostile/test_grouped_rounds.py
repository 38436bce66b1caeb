"""A slot reducer of a grouped round that speaks for its group with a lie: at level 2 it
claims its group brought a million samples, its values scaled to match (per sample they
look like an honest gradient, so the norm check alone passes them). Honest members run
the real protocol on real WebRTC links on loopback; the adversary runs it too, but for
its level-2 part."""

import asyncio

import torch

from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.errors import AveragingError
from engine.averaging.grouped import grouped_allreduce
from engine.averaging.round_plan import GroupedRound, RoundPlan
from engine.averaging.tensor_parts import ReducedPart
from engine.wire.frames import Result
from tests.transport.lost_reducer import with_one_lost
from tests.transport.mesh_pair import make_meshes

GROUPS = GroupedRound([["a", "b", "c", "d"], ["e", "f", "g", "h"]], [["a", "b"], ["e", "f"]], [0.5, 0.5],
                      [[0.5, 0.5], [0.5, 0.5]])
NAMES = [p for g in GROUPS.groups for p in g]
LIAR = "e"  # the second group's reducer of slot 0
CLAIM = 10**6
SAMPLES = 2  # what each member computed, and the backbone's cap on it


async def liar(plan: RoundPlan, local_sum: torch.Tensor, samples: int, loss_sum: float, mesh, timeout: float):
    """Level 1 as the protocol says; at level 2, its group's average as if from CLAIM samples,
    pointing the other way."""
    one = GROUPS.level_one(plan)

    async def finish(j: int, group_part: ReducedPart) -> ReducedPart:
        two = GROUPS.level_two(plan, j)
        await butterfly_allreduce(two, group_part.values * -float(CLAIM), CLAIM, 0.0, mesh, timeout)
        return group_part  # (and its group gets its own average back: it stays unnoticed there)

    return await butterfly_allreduce(one, local_sum, samples, loss_sum, mesh, timeout, finish)


async def test_a_slot_reducer_that_inflates_its_groups_samples_does_not_steer_the_average():
    trend = torch.randn(40_000, generator=torch.Generator().manual_seed(3))
    vectors = {p: trend + 0.1 * torch.randn(40_000) for p in NAMES}
    honest_mean = sum(vectors.values()) / len(vectors)
    meshes = make_meshes(NAMES)
    caps = dict.fromkeys(NAMES, SAMPLES)
    try:
        outcomes = await asyncio.wait_for(asyncio.gather(*(
            (liar if me == LIAR else grouped_allreduce)(
                RoundPlan(1, 2, NAMES, [1.0] * 8, me, caps=caps, groups=GROUPS),
                vectors[me] * SAMPLES, SAMPLES, 0.0, meshes[me], 60)
            for me in NAMES)), 120)
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    honest = {p: o for p, o in zip(NAMES, outcomes, strict=True) if p not in GROUPS.groups[1]}
    # Slot 0 comes in two pieces. The first group's reducer finished the first, and left
    # the liar's claim out (past four times its group's caps, a claim is a lie), and with it
    # the second group's gradient of that piece: the liar's lie costs its own group. The
    # second piece is the liar's to finish (an unchecked reducer's power), and slot 1 is the
    # honest average. Without the caps at level 2 the first piece points against it.
    for o in honest.values():
        assert torch.equal(o.vector, honest["a"].vector)
    vector = honest["a"].vector
    slot = len(vector) // 2
    first_piece = slice(0, slot // 2)
    first_group = sum(vectors[p] for p in GROUPS.groups[0]) / 4
    torch.testing.assert_close(vector[first_piece], first_group[first_piece], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vector[slot:], honest_mean[slot:], rtol=1e-5, atol=1e-5)
    assert float(torch.nn.functional.cosine_similarity(vector, honest_mean, dim=0)) > 0.9


async def test_a_made_up_finished_piece_shown_to_a_backup_costs_one_round_and_moves_nothing(monkeypatch):
    """f, a reducer of slot 1, dies in level 2 before it finished its piece, and g stands in
    for it. b, the slot's other reducer, shows g a result "f had finished" that it made up
    (values of a million). g cannot tell a made-up piece from one f sent before it died, so
    it gives the round up, and the backbone fails the round on everyone at once. That is
    all the lie buys: one round, redone, which withholding its part buys too (at the round's
    deadline); no member applies the made-up values, and nobody is credited for the round."""
    async def made_up_result(plan: RoundPlan, mesh) -> None:
        if "f" not in plan.group:
            return  # (slot 0's level 2)
        piece = plan.group.index("f")
        header = Result(round_id=plan.round_id, epoch=plan.epoch, index=plan.wire(piece), samples=14,
                        loss=1.0)
        await (await mesh.link("g")).send(header, torch.full((5_000,), 1e6).numpy().data)

    outcomes, took = await with_one_lost("f", backup="g", dies_at_level_two=True, monkeypatch=monkeypatch,
                                         at_level_two={"b": made_up_result})
    assert len(outcomes) == 7 and took < 20  # (the round's timeout is 60 s)
    assert all(isinstance(o, AveragingError) for o in outcomes.values()), outcomes
    assert "finished by its reducer before it left" in str(outcomes["g"])
