"""`cotrain peer --save-state`: the state a peer holds, written as it leaves -- whole, even
when a second stop comes while it is written (before, a peer stopping at --max-epochs and
told to stop again at once left no file)."""

import asyncio

import pytest

from engine.peer.saved_state import save_state
from engine.project import OptimizerSpec, ScheduleSpec
from engine.tasks import create_task, initial_model
from engine.training.lr_schedule import build_optimizer
from engine.training.optimizer import CollaborativeOptimizer
from engine.training.state import state_sha256
from engine.wire.tensors import decode_file
from tests.collab.harness import TINY


@pytest.fixture
def optimizer():
    model = initial_model(create_task("demo-lm", dict(TINY), None), 7)
    opt = CollaborativeOptimizer(model, build_optimizer(OptimizerSpec(), model.parameters()), ScheduleSpec(),
                                 project_id="p")
    yield opt
    opt.thread.shutdown()
    opt.hash.close()


async def test_a_stop_during_the_save_waits_for_a_whole_file(tmp_path, optimizer):
    began, go_on = asyncio.Event(), asyncio.Event()
    snapshot = optimizer.snapshot

    async def slow_snapshot():
        began.set()
        await go_on.wait()
        return await snapshot()

    optimizer.snapshot = slow_snapshot
    path = tmp_path / "mine.state"
    leaving = asyncio.ensure_future(save_state(optimizer, path))
    await asyncio.wait_for(began.wait(), 10)
    for _ in range(2):  # the second stop, and a third
        leaving.cancel()
        await asyncio.sleep(0)  # (let each cancel land before the next)
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(leaving, 30)
    saved = decode_file(path.read_bytes())
    held = state_sha256(optimizer.model, optimizer.optimizer, optimizer.epoch)
    assert (saved.index.meta.epoch, saved.state_sha256()) == (optimizer.epoch, held)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.state"]  # no partial file left


async def test_a_folder_that_cannot_be_written_loses_nothing_but_the_file(tmp_path, optimizer, caplog):
    path = tmp_path / "missing" / "mine.state"
    await save_state(optimizer, path)
    assert not path.exists() and "could not save the state" in caplog.text
