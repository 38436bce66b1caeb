"""The hash of the state a peer holds, computed beside its next micro-batches -- and, read
in the same pass, the proof a round's nonce asks for and the copy to go back to.

After a step the peer must tell the backbone the new state's hash, and every joiner and
settlement compares it. Hashed on the compute thread, it held compute up for 2.9 ms of a
small model's 30-ms step (a 3.7 MB state; ALBERT-large's 200 MB would take ~150 ms). A
thread of its own hashes it instead while micro-batches resume (sha256 releases the GIL
on large buffers, so the two run side by side). The proof (1.1 ms on digits) and the copy
of the state kept in case the next step is discarded (0.8 ms) moved there too: the three
made a step cost 4.8 ms of compute against a plain loop's 1.3.

Micro-batches only read the state; what changes it (a step, a download, a restore) calls
``before_change`` first, so the hash is always of the state it names. The copy waits until
the collaboration settles the step (``settled``) or the next step comes, so a peer holds
no more copies than the one it may go back to; a download or a restore needs none."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from engine.training.kept_state import Kept, keep
from engine.training.params import state_proof
from engine.training.state import state_sha256


def _known(value: str) -> Future[str]:
    future: Future[str] = Future()
    future.set_result(value)
    return future


class StateHash:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="state-hash")
        self._current = _known("")  # "" before any state
        self._reading: Future[None] = Future()  # the background pass over the state
        self._reading.set_result(None)
        self._may_copy = threading.Event()  # set once it is decided whether to copy
        self._copy_wanted = False
        self._copy: Kept | None = None

    @property
    def value(self) -> str:
        """The hash of the state held now; waits while it is being computed (one hash's time)."""
        return self._current.result()

    @property
    def current(self) -> Future[str]:
        """The hash of the state held now, done or under way."""
        return self._current

    def before_change(self, step: bool = False) -> None:
        """Call before changing the state: the pass under way must finish reading it. A
        ``step`` keeps a copy of the state it changes: taken now, if it still waited."""
        self._decide_copy(step)
        self._reading.result()

    def settled(self) -> None:
        """The state held before this one is no longer needed: copy this one now."""
        self._decide_copy(True)

    def _decide_copy(self, wanted: bool) -> None:
        if not self._may_copy.is_set():  # (the first word decides)
            self._copy_wanted = wanted
            self._may_copy.set()

    def set(self, digest: str) -> None:
        """The state changed to one whose hash is known (and of which there is no copy)."""
        self._current, self._copy = _known(digest), None

    def copy(self, epoch: int) -> Kept | None:
        """(After ``before_change``.) The copy of the state held now, if it is of ``epoch``;
        handed over once."""
        copy, self._copy = self._copy, None
        return copy if copy is not None and copy.epoch == epoch else None

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epoch: int,
              proof_of: Sequence[torch.Tensor], nonce: str | None) -> tuple[Future[str], Future[str | None]]:
        """Read the state now held in the background: its hash, the proof for ``nonce`` that
        we hold ``proof_of`` (None without one), then the copy. Nothing may change the state
        before ``before_change`` returns."""
        self.before_change()
        self._copy = None
        self._may_copy.clear()
        digest: Future[str] = Future()
        proof: Future[str | None] = Future()
        self._current = digest

        def read() -> None:
            try:
                digest.set_result(state_sha256(model, optimizer, epoch))
                proof.set_result(state_proof(proof_of, nonce) if nonce else None)
            except BaseException as exc:
                for future in (digest, proof):
                    if not future.done():
                        future.set_exception(exc)
                return
            self._may_copy.wait()
            if self._copy_wanted:
                self._copy = keep(model, optimizer, epoch, digest.result())

        self._reading = self._executor.submit(read)
        return digest, proof

    def close(self) -> None:
        self._decide_copy(False)
        self._executor.shutdown(wait=True)
