"""The one thread a peer's torch work runs on, in order: micro-batches, steps, state
snapshots. A step never overlaps a forward pass, and the event loop keeps serving the
network. Work that a round or a joiner waits for goes right after the micro-batch under
way -- unless that one would keep them waiting too long: then it is cut short."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

from engine.governor.throttle import ComputeGate

T = TypeVar("T")
log = logging.getLogger(__name__)


class ComputeThread:
    def __init__(self, gate: ComputeGate | None = None, executor: ThreadPoolExecutor | None = None) -> None:
        self.gate = gate or ComputeGate()
        self.executor = executor or ThreadPoolExecutor(1, thread_name_prefix="cotrain-compute")
        self.last_micro_batch_seconds = 0.0
        self._busy = False
        self._batch_began: float | None = None  # when the micro-batch under way started
        self._outlasted_wait = False
        self._waiting: set[object] = set()  # jobs handed to the thread, not yet begun
        self._prompt: set[object] = set()  # of those, the ones a round or a joiner waits for

    @property
    def busy(self) -> bool:
        """Whether the thread is working right now."""
        return self._busy

    @property
    def others_waiting(self) -> bool:
        """(On the thread.) Whether more work waits behind the job under way."""
        return bool(self._waiting)

    @property
    def prompt_waiting(self) -> bool:
        """(On the thread.) Whether work that a round or a joiner waits for is queued."""
        return bool(self._prompt)

    def run(self, fn: Callable[[], T], prompt: bool = False) -> asyncio.Future[T]:
        """Queue ``fn`` behind the work handed over before it (queued at once, not when the
        caller first awaits, so a run of micro-batches under way yields to it)."""
        ticket = object()

        def gated() -> T:
            self._forget(ticket)
            self._busy = True
            self.gate.enter()
            try:
                return fn()
            finally:
                self.gate.leave()
                self._busy = False

        self._waiting.add(ticket)
        if prompt:
            self._prompt.add(ticket)
        future = asyncio.get_running_loop().run_in_executor(self.executor, gated)
        future.add_done_callback(lambda _: self._forget(ticket))
        return future

    def _forget(self, ticket: object) -> None:
        self._waiting.discard(ticket)
        self._prompt.discard(ticket)

    def timed(self, micro_batch: Callable[[], T]) -> T:
        """(On the thread.) Run a micro-batch and remember how long it took: what waits for
        the next one judges by it whether to wait."""
        began = self._batch_began = time.perf_counter()
        try:
            result = micro_batch()
        finally:
            self._batch_began = None
        self.last_micro_batch_seconds = time.perf_counter() - began
        self._outlasted_wait = False
        return result

    async def run_promptly(self, fn: Callable[[], T], budget: float) -> T:
        """Run ``fn`` right after the micro-batch under way, like a training loop that checks
        for work between micro-batches -- unless the rest of that micro-batch would take more
        than ``budget`` seconds: then it stops at its next layer and its gradient is not
        added. A slow device never keeps a round or a joiner waiting."""
        job = asyncio.ensure_future(self.run(fn, prompt=True))
        began = self._batch_began
        if began is None:
            return await job
        remaining = self.last_micro_batch_seconds - (time.perf_counter() - began)
        if self._outlasted_wait or remaining > budget:
            self.gate.cut_short()
        else:
            try:
                return await asyncio.wait_for(asyncio.shield(job), budget)
            except asyncio.TimeoutError:
                # Until one finishes, assume the next micro-batch will not fit either.
                self._outlasted_wait = True
                self.gate.cut_short()
        log.info("dropping the micro-batch under way rather than keep the collaboration waiting")
        return await job

    async def set_threads(self, threads: int) -> None:
        await self.run(lambda: torch.set_num_threads(threads))

    def shutdown(self) -> None:
        """Stop: a long micro-batch (a small CPU share) must not delay the exit."""
        self.gate.abandon(True)
        self.executor.shutdown(wait=True, cancel_futures=True)
