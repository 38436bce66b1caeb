"""A peer's compute and round pipeline without a network: the real optimizer, progress
reports and round pipeline, with the averaging (and where reports go) in the test's hands."""

from collections.abc import Callable
from dataclasses import dataclass

from engine.peer.progress import ProgressReporter
from engine.peer.round_pipeline import Averager, RoundPipeline
from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.control import RoundStart

MicroBatch = Callable[[], tuple[int, float]]  # (samples, summed loss), its loss back-propagated


async def nowhere(message) -> None:
    pass


@dataclass
class LonePeer:
    optimizer: CollaborativeOptimizer
    progress: ProgressReporter
    pipeline: RoundPipeline

    async def compute(self, micro_batch: MicroBatch, index: int) -> None:
        """A micro-batch, then a report if one is due (as the peer's training loop does)."""
        _, added = await self.optimizer.compute_run(lambda _: micro_batch(), index, lambda: True)
        if added:
            await self.progress.report()

    async def run_round(self, start: RoundStart):
        return await self.pipeline.run(start)


def lone_peer(optimizer: CollaborativeOptimizer, average: Averager, send=nowhere, *, me: str = "me",
              target_batch_size: int, report_interval: float = 60.0, **options) -> LonePeer:
    progress = ProgressReporter(optimizer, send, target_batch_size, report_interval)
    pipeline = RoundPipeline(optimizer, progress, average, send, me=me, target_batch_size=target_batch_size,
                             **options)
    return LonePeer(optimizer, progress, pipeline)
