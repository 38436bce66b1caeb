"""What a member of a grouped round commits to (engine/averaging/grouped.py), laid out by
the round's part indices (planning/grouped_indices.py) so that the backbone checks a
grouped round's parts as it checks a flat round's (engine/backbone/tracker/checks.py):

- level 1: the parts a member sent its group's slot reducers, and what each showed it of
  its own; as a slot reducer, what it combined and the result it got: its group's average
  of the slot, which nobody applies as such -- it goes on, times the group's samples, as
  the reducer's level-2 parts, and a check of the level-1 part also checks those
  (recheck: ``forwarded``);
- level 2: as a slot reducer, its level-2 parts, what it was shown, what it combined;
- results: every piece of every slot as the member applied it, under the piece's level-2
  index, so that the pieces' results are committed by every member that holds the state.
"""

from __future__ import annotations

import torch

from engine.averaging.recheck import as_travelling, part_digest, result_digest
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import Averaged, Reduced
from engine.planning.partition import part_bounds
from engine.wire.commitments import Commitment, PartInputs


def grouped_commitment(plan: RoundPlan, one: RoundPlan, level_one: Commitment | None, applied: torch.Tensor,
                       reduced: list[Reduced], level_two: list[tuple[RoundPlan, Averaged]]) -> Commitment:
    """Our commitment for a grouped round: ``level_one``'s lists are by our level-1 part,
    ``applied`` the vector we apply (empty: an auxiliary member's), ``reduced`` what we
    reduced at either level, ``level_two`` each level-2 round we took part in."""
    grouped = plan.groups
    assert grouped is not None and level_one is not None
    count = grouped.indices(plan.phases).count
    sent: list[str | None] = [None] * count
    shown: list[str | None] = [None] * count
    results: list[str | None] = [None] * count
    for j in range(one.parts):
        if level_one.sent:
            sent[one.wire(j)] = level_one.sent[j]
            shown[one.wire(j)] = level_one.shown[j]
    if applied.numel():
        for index, values in pieces_applied(plan, one, applied):
            results[index] = result_digest(values)
    for two, averaged in level_two:
        mine = averaged.commitment
        assert mine is not None
        for j in range(two.parts):
            sent[two.wire(j)], shown[two.wire(j)] = mine.sent[j], mine.shown[j]
            results[two.wire(j)] = results[two.wire(j)] or mine.results[j]
        # The piece we finish ourselves we "sent" to ourselves, as it would travel: a check
        # of our level-1 part finds every level-2 part we sent on, each as it travels.
        for r in averaged.reduced:
            own = next(((c, values) for c, values in r.inputs if c.sender == plan.me), None)
            if own is not None:
                sent[r.index] = part_digest(own[0].samples, as_travelling(own[1], plan.compression))
    level_two_starts = grouped.indices(plan.phases).level_two_offset(0)
    for r in reduced:
        if r.index < level_two_starts:  # a level-1 part: the group's average we forwarded
            results[r.index] = result_digest(r.result)
    inputs = [PartInputs(index=r.index, inputs=[c for c, _ in r.inputs])
              for r in sorted(reduced, key=lambda r: r.index)]
    return Commitment(sent=sent, results=results, reduced=inputs, shown=shown)


def pieces_applied(plan: RoundPlan, one: RoundPlan, applied: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """Each non-empty piece of each slot of ``applied``, with its level-2 index."""
    grouped = plan.groups
    assert grouped is not None
    indices = grouped.indices(plan.phases)
    slots = part_bounds(applied.numel(), one.shares)[:len(grouped.slot_shares)]
    out = []
    for k, (lo, hi) in enumerate(slots):
        base = indices.level_two_offset(k) + plan.phase * len(grouped.groups)
        for g, (a, b) in enumerate(part_bounds(hi - lo, grouped.pieces[k])):
            if b > a:
                out.append((base + g, applied[lo + a:lo + b]))
    return out
