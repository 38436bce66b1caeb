"""``cotrain backbone --tensorboard DIR``: each project's learning curve as TensorBoard event
files in ``DIR/PROJECT``, where researchers watch runs: every step's training loss, samples,
peers and averaging time, and the held-out loss and accuracy where peers scored them.
tensorboardX writes them from a thread of its own; a project whose files cannot be written
is logged once and written no more (its curve is in the database all the same)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from engine.wire.control import Step

log = logging.getLogger(__name__)
FLUSH_SECONDS = 5.0


class CurveEvents:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._writers: dict[str, Any] = {}  # project -> tensorboardX SummaryWriter
        self._failed: set[str] = set()

    def step(self, project: str, step: Step) -> None:
        scalars = {"train/samples": step.samples, "train/peers": step.peers,
                   "train/round_seconds": step.round_seconds}
        if step.loss is not None:
            scalars["train/loss"] = step.loss
        self._write(project, step.epoch, scalars)

    def heldout(self, project: str, epoch: int, loss: float | None, accuracy: float | None) -> None:
        scalars = {name: value for name, value in (("heldout/loss", loss), ("heldout/accuracy", accuracy))
                   if value is not None}
        self._write(project, epoch, scalars)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def _write(self, project: str, epoch: int, scalars: dict[str, float]) -> None:
        if project in self._failed:
            return
        now = time.time()
        try:
            writer = self._writers.get(project)
            if writer is None:
                from tensorboardX import SummaryWriter

                writer = self._writers[project] = SummaryWriter(str(self.directory / project),
                                                                flush_secs=FLUSH_SECONDS)
            for tag, value in scalars.items():
                writer.add_scalar(tag, value, epoch, walltime=now)
        except (OSError, ValueError) as exc:
            self._failed.add(project)
            log.warning("%s: writing its TensorBoard events to %s failed; writing no more: %s",
                        project, self.directory / project, exc)
