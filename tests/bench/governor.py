"""The governor as a user feels it.

    python -m tests.bench.governor [--quick]

1. Pause and resume latency over repeated trials, on a real X server: input (xdotool) to
   compute stopped, and idle threshold reached to compute running again.
2. Interference: how much slower a foreground CPU task runs while a worker trains, at 100%
   and at 50%, at normal and at the lowest OS priority, against no worker at all.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from engine.governor.governor import Governor
from engine.governor.idle import IdleDetector, XScreenSaverIdle
from engine.governor.limits import Limits
from engine.governor.power import PowerSource
from engine.paths import engine_command
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.collab.processes import write_catalog

DEMO = dict(d_model=512, heads=8, ff=2048, layers=4, embedding=128, seq_len=64, micro_batch=8)


async def _wait(condition, timeout: float) -> float:
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.005)
    return time.monotonic()


def _xdotool(display: str) -> None:
    subprocess.run(["xdotool", "mousemove", str(int(time.time() * 1000) % 500), "10"],
                   env={**os.environ, "DISPLAY": display}, check=True)


async def latency_trials(trials: int) -> None:
    if not shutil.which("Xvfb") or not shutil.which("xdotool"):
        print("pause/resume latency: skipped (needs Xvfb and xdotool)")
        return
    display = f":{200 + os.getpid() % 500}"
    server = subprocess.Popen(["Xvfb", display, "-screen", "0", "800x600x24", "-nolisten", "tcp"],
                              stderr=subprocess.DEVNULL)
    os.environ["DISPLAY"] = display
    threshold = 1.0
    limits = Limits(only_when_idle=True, idle_minutes=threshold / 60)
    pauses, resumes = [], []
    try:
        await asyncio.sleep(1.0)  # the X server starting up, not synchronisation of the system under test
        with tempfile.TemporaryDirectory() as tmp:
            project = tiny_project(task_params=DEMO, target_batch_size=10**6)
            async with running_backbone(Path(tmp), project) as backbone:
                peer = start_peer(backbone.url, project.id, "bench", threads=1, limits=limits)
                governor = Governor(limits, IdleDetector([XScreenSaverIdle()]),
                                    PowerSource(sensors_battery=lambda: None))
                governing = asyncio.ensure_future(governor.run(peer.peer))
                p = peer.peer
                await _wait(lambda: p.joined and p.running and p.optimizer.thread.busy, 120)
                for _ in range(trials):
                    await _wait(lambda: p.running and p.optimizer.thread.busy, 30)
                    await asyncio.sleep(0.1 + (time.monotonic() % 0.3))  # land anywhere in a micro-batch
                    touched = time.monotonic()
                    await asyncio.to_thread(_xdotool, display)
                    stopped = await _wait(lambda: not p.running and not p.optimizer.thread.busy, 10)
                    pauses.append(stopped - touched)
                    running = await _wait(lambda: p.running and p.optimizer.thread.busy, 30)
                    resumes.append(running - (touched + threshold))
                governing.cancel()
                await stop_all(peer)
    finally:
        server.terminate()
    print(f"latency over {trials} trials (demo-lm, ~0.5 s micro-batches, idle threshold {threshold:.0f} s):")
    for label, values, target in (("pause  (input -> compute stopped)", pauses, " (target < 1000 ms)"),
                                  ("resume (idle threshold -> compute running)", resumes, "")):
        print(f"  {label:<43} median {statistics.median(values) * 1000:5.0f} ms, "
              f"max {max(values) * 1000:5.0f} ms{target}", flush=True)


def _foreground_task() -> float:
    """A fixed amount of single-threaded work, as a user's program: seconds it takes."""
    torch.set_num_threads(1)
    a = torch.randn(384, 384)
    began = time.perf_counter()
    for _ in range(1500):
        a = torch.tanh(a @ a / 384)
    return time.perf_counter() - began


def _wait_until_computing(worker: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    """Until the worker has joined, synced and keeps at least a core busy: its steady state."""
    process, deadline = psutil.Process(worker.pid), time.monotonic() + timeout
    while "in sync at epoch" not in log.read_text() or process.cpu_percent(interval=0.5) < 40:
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not start computing:\n{log.read_text()[-2000:]}")


def interference(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        project = tiny_project(task_params=DEMO, target_batch_size=10**6)
        catalog = write_catalog(Path(tmp) / "catalog.json", project)
        backbone = subprocess.Popen([*engine_command(), "backbone", "--port", "0", "--data-dir",
                                     str(Path(tmp) / "data"), "--catalog", str(catalog)],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        url = backbone.stdout.readline().split()[-1]
        rows = []
        try:
            for label, flags in (
                ("no worker", None),
                ("worker at 100%, normal priority", ["--normal-priority"]),
                ("worker at 50%, normal priority", ["--normal-priority", "--cpu-percent", "50"]),
                ("worker at 50%, lowest priority", ["--cpu-percent", "50"]),
            ):
                worker = None
                if flags is not None:
                    log = Path(tmp) / "worker.log"
                    with open(log, "wb") as err:
                        worker = subprocess.Popen([*engine_command(), "peer", "--backbone", url, "--project",
                                                   project.id, "--threads", str(os.cpu_count()), *flags],
                                                  stdout=subprocess.DEVNULL, stderr=err)
                    _wait_until_computing(worker, log)
                times = [_foreground_task() for _ in range(repeats)]
                if worker is not None:
                    worker.terminate()
                    worker.wait(30)
                rows.append((label, statistics.median(times)))
        finally:
            backbone.terminate()
            backbone.wait(30)
    base = rows[0][1]
    print(f"interference: a single-threaded foreground task (median of {repeats}), worker on all "
          f"{os.cpu_count()} cores:")
    for label, seconds in rows:
        print(f"  {label:<34} {seconds:6.2f} s   slowdown {seconds / base:4.2f}x", flush=True)


def main(quick: bool = False) -> None:
    print("\n== Governor", flush=True)
    asyncio.run(latency_trials(5 if quick else 20))
    interference(2 if quick else 5)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
