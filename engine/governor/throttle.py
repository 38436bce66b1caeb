"""Enforcement on the compute thread: a duty cycle, and abandoning a micro-batch on pause.

Every piece of compute-thread work runs between ``enter`` and ``leave``; forward pre-hooks
on up to ``CHECKS`` modules spread through the model (about one per ``SLICE`` of a
micro-batch) call ``check`` during each forward pass. Busy time builds up a debt of rest
(one second of work at 50% owes one second of rest), paid in slices of about ``SLICE``
seconds at a check, or by any idle time between pieces of work. A pause stops a forward
pass at the next hooked module; a backward pass, which has no hooks, runs to its end.
``cut_short`` does the same once, for a round that should not wait for a long micro-batch.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time

import torch

log = logging.getLogger(__name__)
SLICE = 0.05
CHECKS = 16


class MicroBatchAbandoned(Exception):
    """A micro-batch ended without adding a gradient: stopped inside its forward pass (the
    user needs the machine now, or a round must not wait for the rest of it), or its fp16
    gradient overflowed."""


class ComputeGate:
    def __init__(self, cpu_percent: int = 100, slowdown: float = 1.0) -> None:
        """``slowdown`` > 1 makes this peer behave like a device that many times slower
        (tests and benchmarks of heterogeneous collaborations)."""
        self.cpu_percent = cpu_percent
        self.slowdown = slowdown
        self._abandon = threading.Event()
        self._cut = threading.Event()
        self._wake = threading.Event()
        self._debt = 0.0
        self._mark = time.perf_counter()
        self.rested_seconds = 0.0
        self._full_speed = self._ratio() <= 0

    def set_cpu_percent(self, percent: int) -> None:
        self.cpu_percent = percent
        self._debt = 0.0
        self._mark = time.perf_counter()
        self._full_speed = self._ratio() <= 0
        self._wake.set()  # cut a long rest short; the new share applies from here

    def abandon(self, abandoned: bool) -> None:
        """While set, forward passes stop at the next layer."""
        if abandoned:
            self._abandon.set()
            self._wake.set()
        else:
            self._abandon.clear()

    def cut_short(self) -> None:
        """Stop the work under way at its next layer, once; the next piece of work runs."""
        self._cut.set()
        self._wake.set()

    def enter(self) -> None:
        self._cut.clear()
        now = time.perf_counter()
        self._debt = max(self._debt - (now - self._mark), 0.0)  # idle time is rest
        self._mark = now

    def leave(self) -> None:
        self._account()

    def check(self) -> None:
        """Called often from the compute thread: rest when enough is owed."""
        if self._abandon.is_set() or self._cut.is_set():
            raise MicroBatchAbandoned
        if self._full_speed:
            return  # nothing to account: this runs before every module of every forward pass
        self._account()
        if self._debt < SLICE * self._ratio() or self._debt <= 0:
            return
        began = time.perf_counter()
        self._wake.clear()
        if self._abandon.is_set() or self._cut.is_set():
            raise MicroBatchAbandoned  # set just before the clear: its wake-up is gone
        self._wake.wait(self._debt)
        rested = time.perf_counter() - began
        self.rested_seconds += rested
        self._debt = max(self._debt - rested, 0.0)
        self._mark = time.perf_counter()
        if self._abandon.is_set() or self._cut.is_set():
            raise MicroBatchAbandoned

    def install(self, model: torch.nn.Module, micro_batch_seconds: float = math.inf) -> None:
        """Hooks on modules spread evenly in the order ``modules()`` lists them (close to the
        order a forward pass meets them), the model itself first, so a pause stops a forward
        pass before it starts or within about a ``SLICE`` of it: one per ``SLICE`` of a
        micro-batch of ``micro_batch_seconds``, at most ``CHECKS``. Each hooked module's call
        takes PyTorch's slow path: a hook on every module cost 2-3% of a small ResNet's
        micro-batch (76 modules), and 16 of them still 2% of a 6-ms one (digits)."""
        checks = max(1, math.ceil(min(micro_batch_seconds / SLICE, CHECKS)))
        modules = list(model.modules())
        for module in modules[:: max(1, math.ceil(len(modules) / checks))][:checks]:
            module.register_forward_pre_hook(self._hook)

    def _ratio(self) -> float:
        return 100.0 * self.slowdown / self.cpu_percent - 1.0

    def _account(self) -> None:
        now = time.perf_counter()
        self._debt += (now - self._mark) * self._ratio()
        self._mark = now

    def _hook(self, module, inputs) -> None:
        self.check()


def lower_priority() -> None:
    """Run at the lowest OS priority, so any program the user starts comes first."""
    try:
        if sys.platform == "win32":
            import psutil

            psutil.Process().nice(psutil.IDLE_PRIORITY_CLASS)
        else:
            os.nice(19 - os.nice(0))
    except (OSError, AttributeError) as exc:
        log.warning("could not lower the worker's priority: %s", exc)
