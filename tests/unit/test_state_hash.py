"""After a step, the new state is hashed beside the next micro-batches, not before them
(engine/training/state_hash.py); whatever changes the state waits for that hash."""

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from engine.averaging.tensor_parts import Averaged
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training import optimizer as optimizer_module
from engine.training import state_hash
from engine.training.kept_state import keep
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.params import state_proof
from engine.training.state import state_sha256
from engine.wire.control import RoundDone, RoundStart
from tests.collab.harness import TINY
from tests.conftest import until
from tests.lone_peer import lone_peer
from tests.unit.test_overlap import micro_batch


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


class HeldHash:
    """state_sha256 that waits for ``release`` once called; it notes the state's hash when
    called and returns the one when released: they differ if the state changed meanwhile."""

    def __init__(self) -> None:
        self.hashing, self.release = threading.Event(), threading.Event()
        self.when_called: list[str] = []

    def __call__(self, model, optimizer, epoch):
        self.when_called.append(state_sha256(model, optimizer, epoch))
        self.hashing.set()
        assert self.release.wait(30), "never released"
        return state_sha256(model, optimizer, epoch)


async def average_alone(plan, vector, samples, loss_sum, timeout) -> Averaged:
    return Averaged(vector / samples, samples, loss_sum / samples, {plan.me: samples})


async def synced_lone_peer(task, told: list):
    """A lone peer, ready to compute; what it tells the backbone goes to ``told``."""
    model = initial_model(task, 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p")

    async def send(message) -> None:
        told.append(message)

    peer = lone_peer(opt, average_alone, send, target_batch_size=8)
    await opt.mark_synced()
    return opt, peer


async def step_with_held_hash(task, monkeypatch, told: list):
    """A lone peer that computed two micro-batches and whose round's step is taken, its
    state's hash held; the optimizer, the round under way and the held hash."""
    held = HeldHash()
    monkeypatch.setattr(state_hash, "state_sha256", held)
    opt, peer = await synced_lone_peer(task, told)
    await opt.compute_run(micro_batch(task, opt), 0, lambda: len(opt.accumulator.batches) >= 2)
    round_ = asyncio.ensure_future(peer.run_round(RoundStart(1, 0, ["me"], [1.0], 30.0)))
    assert await asyncio.to_thread(held.hashing.wait, 30), "the step never hashed its state"
    return opt, round_, held


async def test_micro_batches_resume_while_the_new_state_is_hashed(task, monkeypatch):
    told: list = []
    opt, round_, held = await step_with_held_hash(task, monkeypatch, told)

    used, added = await asyncio.wait_for(
        opt.compute_run(micro_batch(task, opt), 2, lambda: len(opt.accumulator.batches) >= 2), 30)
    assert (used, added) == (2, 2) and not round_.done(), "computing waited for the hash"
    assert opt.in_round, "the round ended before its state's hash was in: a resync could land under it"

    # Loading a fresh state now must wait until the hash under way has read the stepped one.
    fresh = initial_model(task, 8)
    reset = asyncio.ensure_future(opt.reset(fresh))
    held.release.set()
    outcome = await asyncio.wait_for(round_, 30)
    assert outcome is not None and outcome.step.epoch == 1
    assert outcome.step.state_sha256 == held.when_called[0], "the state changed while it was hashed"
    (done,) = [m for m in told if isinstance(m, RoundDone)]
    assert done.ok and done.state_sha256 == held.when_called[0]
    assert await asyncio.wait_for(reset, 30) == opt.hash.value == state_sha256(fresh, opt.optimizer, 0)
    opt.thread.shutdown()
    opt.hash.close()


async def test_a_settled_step_is_checked_against_the_hash_once_it_is_in(task, monkeypatch):
    opt, round_, held = await step_with_held_hash(task, monkeypatch, [])
    assert opt.kept is not None  # the state before the step, until the step settles
    opt.settled(1, "0" * 64)  # (another state: it releases nothing)
    opt.settled(1, held.when_called[0])  # returns at once: the event loop never waits for a hash
    held.release.set()
    assert (await asyncio.wait_for(round_, 30)) is not None
    await until(lambda: opt.kept is None, 10, "the kept state released once the hash matched")
    opt.thread.shutdown()
    opt.hash.close()


class CountedKeep:
    """kept_state.keep, counting where it ran: the state-hash thread or another."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, model, optimizer, epoch, digest):
        self.threads.append(threading.current_thread().name)
        return keep(model, optimizer, epoch, digest)


async def test_the_copy_to_go_back_to_is_made_beside_compute_once_the_step_settles(task, monkeypatch):
    """The proof and the copy of the new state are read with its hash, off the compute
    thread; the copy waits until the step settles, so a peer never holds two copies."""
    told: list = []
    counted = CountedKeep()
    monkeypatch.setattr(state_hash, "keep", counted)
    monkeypatch.setattr(optimizer_module, "keep", counted)
    opt, peer = await synced_lone_peer(task, told)
    nonce = "ab" * 32

    async def one_round(round_id: int, epoch: int):
        await opt.compute_run(micro_batch(task, opt), 10 * round_id,
                              lambda: len(opt.accumulator.batches) >= 2)
        outcome = await asyncio.wait_for(peer.run_round(RoundStart(round_id, epoch, ["me"], [1.0], 30.0,
                                                                   nonce=nonce)), 30)
        assert outcome is not None and outcome.step.epoch == epoch + 1
        return outcome

    first = await one_round(1, 0)
    assert counted.threads == ["cotrain-compute_0"], "the first step had no copy made ahead: it copied"
    done = [m for m in told if isinstance(m, RoundDone)][-1]
    assert done.proof == state_proof(opt.params, nonce), "the proof is of the stepped state"
    assert opt.kept is not None and len(counted.threads) == 1, "no second copy while the step is unsettled"

    opt.settled(1, first.step.state_sha256)
    await until(lambda: len(counted.threads) == 2, 10, "the settled state copied")
    assert counted.threads[1].startswith("state-hash"), "copied beside compute"

    # The next step is discarded: the peer goes back to the copy, bit for bit.
    await one_round(2, 1)
    assert len(counted.threads) == 2, "the step used the copy made ahead"
    assert await opt.restore(1, first.step.state_sha256)
    assert opt.epoch == 1 and opt.hash.value == first.step.state_sha256
    assert state_sha256(opt.model, opt.optimizer, 1) == first.step.state_sha256
    opt.thread.shutdown()
    opt.hash.close()


def test_a_process_whose_last_step_never_settles_still_exits():
    """The copy waits for a word that may never come (the backbone went away): no job may
    wait for it on the thread, or the interpreter waits for that thread at exit."""
    script = (
        "import torch\n"
        "from engine.training.state_hash import StateHash\n"
        "model = torch.nn.Linear(2, 2)\n"
        "hashed, _ = StateHash().start(model, torch.optim.SGD(model.parameters(), lr=0.1), 1,\n"
        "                              list(model.parameters()), 'ab' * 32)\n"
        "print(hashed.result())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip()) == 64


async def test_a_copy_that_fails_beside_compute_costs_only_that_copy(task, monkeypatch):
    """Out of memory while copying beside compute: the next step copies the state itself,
    and everything after it works as before."""
    def failing_keep(*args):
        raise MemoryError("no room for the copy")

    opt, peer = await synced_lone_peer(task, [])
    monkeypatch.setattr(state_hash, "keep", failing_keep)
    for epoch in range(3):
        await opt.compute_run(micro_batch(task, opt), 10 * epoch, lambda: len(opt.accumulator.batches) >= 2)
        start = RoundStart(epoch + 1, epoch, ["me"], [1.0], 30.0)
        outcome = await asyncio.wait_for(peer.run_round(start), 30)
        assert outcome is not None and outcome.step.epoch == epoch + 1
        opt.settled(epoch + 1, outcome.step.state_sha256)
    assert opt.kept is None and opt.epoch == 3
    fresh = initial_model(task, 8)
    assert await asyncio.wait_for(opt.reset(fresh), 30) == state_sha256(fresh, opt.optimizer, 0)
    opt.thread.shutdown()
    opt.hash.close()
