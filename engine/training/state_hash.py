"""The hash of the state a peer holds, computed beside its next micro-batches.

After a step the peer must tell the backbone the new state's hash, and every joiner and
settlement compares it. Hashed on the compute thread, it held compute up for 2.9 ms of a
small model's 30-ms step (a 3.7 MB state; ALBERT-large's 200 MB would take ~150 ms). A
thread of its own hashes it instead while micro-batches resume (sha256 releases the GIL
on large buffers, so the two run side by side). Micro-batches only read the state; what
changes it (a step, a download, a restore) waits for the hash first, so the hash is always
of the state it names."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.training.state import state_sha256


def _known(digest: str) -> Future[str]:
    future: Future[str] = Future()
    future.set_result(digest)
    return future


class StateHash:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="state-hash")
        self._current = _known("")  # "" before any state

    @property
    def value(self) -> str:
        """The hash of the state held now; waits while it is being computed (one hash's time)."""
        return self._current.result()

    @property
    def current(self) -> Future[str]:
        """The hash of the state held now, done or under way."""
        return self._current

    def before_change(self) -> None:
        """Call before changing the state: the hash under way must finish reading it."""
        self._current.result()

    def set(self, digest: str) -> None:
        self._current = _known(digest)

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int) -> Future[str]:
        """Hash the state now held, in the background; nothing may change it before
        ``before_change`` returns."""
        self.before_change()
        self._current = self._executor.submit(state_sha256, model, optimizer, epoch)
        return self._current

    def close(self) -> None:
        self._executor.shutdown(wait=True)
