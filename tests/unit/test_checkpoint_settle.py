"""A checkpoint's snapshot may be a step past the epoch the backbone asked for (rounds outran
it): it is uploaded once the collaboration settled on that step, never before (the backbone
has no state of the epoch to check it against yet) and never if it settled on another."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from engine.peer import rounds as rounds_module
from engine.peer.events import EpochCompleted
from engine.peer.rounds import Rounds
from engine.wire.control import Step

OURS, THEIRS = "a" * 64, "b" * 64


def step(epoch: int, state: str) -> Step:
    return Step(epoch, round_id=epoch, loss=1.0, samples=64, peers=2, round_seconds=0.1, state_sha256=state)


def settle(rounds: Rounds, history: list, epoch: int, state: str, ours: str = OURS) -> None:
    """The Step of ``epoch``, as the backbone loop hands it over; our history holds it if it
    names our state (the round's confirmation)."""
    if state == ours:
        history.append(EpochCompleted(step=step(epoch, state), my_samples=32))
    rounds.settled(step(epoch, state))


async def test_a_snapshot_a_step_on_waits_for_that_step_to_settle():
    history: list[EpochCompleted] = []
    rounds = Rounds(SimpleNamespace(history=history))
    settle(rounds, history, 4, OURS)
    waiting = asyncio.ensure_future(rounds.settled_on(5, OURS))
    done, _ = await asyncio.wait({waiting}, timeout=0.1)  # nothing settled epoch 5 yet
    assert not done
    settle(rounds, history, 5, OURS)
    assert await asyncio.wait_for(waiting, 5) is True


async def test_a_snapshot_the_collaboration_settled_otherwise_is_not_uploaded():
    history: list[EpochCompleted] = []
    rounds = Rounds(SimpleNamespace(history=history))
    waiting = asyncio.ensure_future(rounds.settled_on(5, OURS))
    settle(rounds, history, 5, THEIRS)
    assert await asyncio.wait_for(waiting, 5) is False


async def test_a_snapshot_whose_epoch_never_settles_is_given_up(monkeypatch):
    monkeypatch.setattr(rounds_module, "SETTLE_PATIENCE", 0.2)
    rounds = Rounds(SimpleNamespace(history=[]))
    assert await asyncio.wait_for(rounds.settled_on(5, OURS), 5) is False


@pytest.mark.parametrize("later", [0, 3])
async def test_a_snapshot_of_a_step_settled_before_is_uploaded_at_once(later):
    history: list[EpochCompleted] = []
    rounds = Rounds(SimpleNamespace(history=history))
    settle(rounds, history, 5, OURS)
    for epoch in range(6, 6 + later):
        settle(rounds, history, epoch, OURS)
    assert await asyncio.wait_for(rounds.settled_on(5, OURS), 1) is True
