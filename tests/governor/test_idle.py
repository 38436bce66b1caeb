"""Idle detection for real: an X server, its screen-saver extension, and xdotool as the user."""

import asyncio
import contextlib
import time

import psutil
import pytest

from engine.governor.governor import Governor
from engine.governor.idle import IdleDetector, XScreenSaverIdle
from engine.governor.limits import Limits
from engine.governor.power import PowerSource
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.collab.processes import spawn_peer, terminate
from tests.conftest import until
from tests.xserver import xdotool, xvfb

pytestmark = pytest.mark.slow
# A model whose micro-batch lasts long enough that stopping mid-way matters (~0.5 s here).
SLOW_BATCHES = dict(d_model=512, heads=8, ff=2048, layers=4, embedding=128, seq_len=64, micro_batch=8)


@pytest.fixture
def display(monkeypatch):
    with xvfb() as name:
        monkeypatch.setenv("DISPLAY", name)
        yield name


def test_the_x_screensaver_source_measures_idle_time_and_input_resets_it(display):
    source = XScreenSaverIdle()
    deadline = time.monotonic() + 10
    while (before := source.idle_seconds()) < 0.5:  # the server counts time without input
        assert time.monotonic() < deadline, "the X server's idle time does not grow"
        time.sleep(0.05)
    xdotool(display, "mousemove", "100", "100")
    after = source.idle_seconds()
    assert after < 0.5 <= before
    reading = IdleDetector([source]).read()
    assert reading.source == "X11 XScreenSaver" and reading.seconds is not None


def test_without_a_display_readings_stay_unavailable_and_cheap(monkeypatch):
    """A headless peer reads idleness once a second for as long as it runs: each reading
    used to run ``ldconfig -p`` twice to look for libX11 and libXss."""
    import subprocess

    monkeypatch.delenv("DISPLAY", raising=False)
    started = []
    real_popen = subprocess.Popen.__init__

    def popen(self, args, *rest, **kwargs):
        started.append(args)
        real_popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    detector = IdleDetector([XScreenSaverIdle()])
    readings = [detector.read() for _ in range(5)]
    assert all(r.seconds is None and "cannot open the X display" in r.describe for r in readings)
    assert len(started) <= 2, started  # at most the first reading's look for the two libraries


async def test_input_pauses_compute_within_a_second_and_idleness_resumes_it(display, tmp_path):
    idle_minutes = 0.05  # 3 seconds
    limits = Limits(only_when_idle=True, idle_minutes=idle_minutes)
    project = tiny_project(task_params=SLOW_BATCHES, target_batch_size=10_000)
    async with running_backbone(tmp_path, project) as backbone:
        peer = start_peer(backbone.url, project.id, "volunteer", threads=1, limits=limits)
        governor = Governor(limits, IdleDetector([XScreenSaverIdle()]),
                            PowerSource(sensors_battery=lambda: None))
        governing = asyncio.ensure_future(governor.run(peer.peer))
        try:
            await until(lambda: peer.peer.running and peer.peer.joined
                        and peer.peer.optimizer.accumulator.samples > 0, 60, "idle compute to start")
            await until(lambda: peer.peer.optimizer.thread.busy, 10, "a micro-batch under way")
            touched = time.monotonic()
            await asyncio.to_thread(xdotool, display, "mousemove", "200", "150")
            await until(lambda: not peer.peer.optimizer.thread.busy and not peer.peer.running, 5,
                        "compute to stop")
            stopped = time.monotonic() - touched
            assert governor.decision.reason == "Waiting for the computer to be idle"
            samples = peer.peer.optimizer.accumulator.samples
            await until(lambda: peer.peer.running, 15, "compute to resume once idle again")
            resumed = time.monotonic() - touched
            await until(lambda: peer.peer.optimizer.accumulator.samples > samples, 15, "new samples")
        finally:
            governing.cancel()
            await stop_all(peer)
    assert stopped < 1.0
    assert idle_minutes * 60 <= resumed < idle_minutes * 60 + 2.0


async def test_cotrain_peer_says_each_change_of_state_and_runs_at_the_lowest_priority(display, tmp_path):
    project = tiny_project(target_batch_size=10_000)
    log = tmp_path / "volunteer.log"
    waiting, running = "paused: Waiting for the computer to be idle", "Contributing"
    walked_away = asyncio.Event()

    async def someone_uses_the_mouse() -> None:
        """Input every second until the peer has said it waits: however long it takes to
        start, it never sees the 3 s of idleness before it has seen someone at work."""
        x = 10
        while not walked_away.is_set():
            await asyncio.to_thread(xdotool, display, "mousemove", str(x), "10")
            x = 30 - x
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(walked_away.wait(), 1.0)

    async with running_backbone(tmp_path, project) as backbone:
        user = asyncio.ensure_future(someone_uses_the_mouse())
        peer = await spawn_peer(backbone.url, project.id, "volunteer", tmp_path, "--only-when-idle", "0.05",
                                env={"DISPLAY": display})
        try:
            try:
                await until(lambda: waiting in log.read_text(), 60, "the peer to say it waits for idleness")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; it said:\n{log.read_text()[-3000:]}") from None
            walked_away.set()
            await user
            await until(lambda: running in log.read_text().split(waiting, 1)[1], 30, "it to start")
            assert psutil.Process(peer.process.pid).nice() == 19  # any program the user runs comes first
            await asyncio.to_thread(xdotool, display, "mousemove", "300", "300")
            await until(lambda: log.read_text().count(waiting) == 2, 10, "the peer to say it paused again")
        finally:
            walked_away.set()
            await user
            await terminate(peer)
    said = [line for line in log.read_text().splitlines() if line in (waiting, running)]
    assert said[:3] == [waiting, running, waiting]


async def test_running_on_battery_pauses_and_the_charger_resumes(tmp_path):
    from collections import namedtuple

    battery = namedtuple("sbattery", "percent secsleft power_plugged")
    state = {"plugged": True}
    power = PowerSource(sensors_battery=lambda: battery(80, 3600, state["plugged"]))
    clock = {"now": __import__("datetime").datetime(2026, 11, 23, 12, 0)}
    governor = Governor(Limits(run_on_battery=False), IdleDetector([]), power,
                        memory_mb=lambda: 100.0, clock=lambda: clock["now"])
    assert (await governor.step()).run
    state["plugged"] = False
    decision = await governor.step()
    assert not decision.run and decision.reason == "Paused on battery"
    state["plugged"] = True
    assert not (await governor.step()).run  # not back before the power settles
    clock["now"] += __import__("datetime").timedelta(seconds=20)
    assert (await governor.step()).run
