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
``before_change`` first, so the hash is always of the state it names. The copy is taken
once the collaboration settles the step (``settled``) or the next step comes, so a peer
holds no more copies than the one it may go back to; a download or a restore needs none.
No job waits on the thread for that word: a peer that never gets it still exits."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import torch

from engine.training.kept_state import Kept, keep
from engine.training.params import state_proof
from engine.training.state import state_sha256

log = logging.getLogger(__name__)


def _known(value: str) -> Future[str]:
    future: Future[str] = Future()
    future.set_result(value)
    return future


@dataclass
class _Uncopied:
    """A stepped state whose copy waits for the word to take it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    epoch: int
    digest: Future[str]


class StateHash:
    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="state-hash")
        self._current = _known("")  # "" before any state
        self._reading: Future[None] = Future()  # the last job reading the state
        self._reading.set_result(None)
        self._lock = threading.Lock()  # (asked from the event loop and the compute thread)
        self._uncopied: _Uncopied | None = None
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
        """Call before changing the state: what reads it must finish first. A ``step``
        keeps a copy of the state it changes: taken now, if it was not yet."""
        with self._lock:
            if step:
                self._copy_now()
            self._uncopied = None
        wait([self._reading])

    def settled(self, digest: Future[str]) -> None:
        """The state whose hash is ``digest`` settled: the one before it is no longer
        needed, so copy this one now (if it is still the one held)."""
        with self._lock:
            if self._uncopied is not None and self._uncopied.digest is digest:
                self._copy_now()

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
        """Read the state now held in the background: its hash and the proof for ``nonce``
        that we hold ``proof_of`` (None without one); its copy once asked. Nothing may change
        the state before ``before_change`` returns."""
        self.before_change()
        digest: Future[str] = Future()
        proof: Future[str | None] = Future()

        def read() -> None:
            try:
                digest.set_result(state_sha256(model, optimizer, epoch))
                proof.set_result(state_proof(proof_of, nonce) if nonce else None)
            except BaseException as exc:
                for future in (digest, proof):
                    if not future.done():
                        future.set_exception(exc)

        with self._lock:  # (published before it is read; the copy is queued after the read)
            self._current, self._copy = digest, None
            self._reading = self._executor.submit(read)
            self._uncopied = _Uncopied(model, optimizer, epoch, digest)
        return digest, proof

    def _copy_now(self) -> None:
        """(Holding the lock.) Copy the state waiting for it, after what reads it now."""
        uncopied, self._uncopied = self._uncopied, None
        if uncopied is None:
            return

        def copy() -> None:
            state = uncopied
            try:
                self._copy = keep(state.model, state.optimizer, state.epoch, state.digest.result())
            except Exception:  # (the step copies the state itself instead)
                log.exception("could not copy the state beside compute")

        self._reading = self._executor.submit(copy)

    def close(self) -> None:
        with self._lock:
            self._uncopied = None
        self._executor.shutdown(wait=True)
